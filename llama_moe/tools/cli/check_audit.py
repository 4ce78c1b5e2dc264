"""``python -m llama_moe check-audit MODEL PROFILE [--cache-mib 256]``: a real llama-server with the hybrid cache
and an audit log, run twice, through the mailbox and through the scheduler's copies: the same text, and audit
logs that pass ``audit check`` (``llama_moe.tools.server.check_audit``)."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

import requests

from ..equivalence import PROMPTS
from ..errors import CheckAuditError, ServerStartError
from ..server.check_audit import check_audit_run


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check-audit", help="serve with the hybrid cache and an audit log, through the mailbox and without: "
                                           "the same text, and logs that pass audit check")
    p.add_argument("model")
    p.add_argument("profile")
    p.add_argument("--cache-mib", type=float, default=256)
    p.add_argument("-n", "--n-predict", type=int, default=48, help="tokens per completion (default 48)")
    p.add_argument("-t", "--threads", type=int)
    p.add_argument("--keep", metavar="DIR", help="keep the audit logs and server logs here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    try:
        result = check_audit_run(args.model, args.profile, args.cache_mib, args.n_predict, args.threads, args.keep, log)
    except (ServerStartError, requests.RequestException) as exc:
        raise CheckAuditError(f"the server run failed: {exc}") from exc
    if args.json:
        print(json.dumps(asdict(result) | {"ok": result.ok}, indent=2))
    else:
        for r in result.runs:
            name = "mailbox  " if r.mailbox else "scheduler"
            print(f"{'PASS' if not r.errors else 'FAIL'}  {name} audit log: {r.n_records} records, {len(r.errors)} errors, "
                  f"{r.warnings} warnings{''.join(chr(10) + '      ' + e for e in r.errors[:10])}")
        print(f"{'PASS' if result.mailbox_used else 'FAIL'}  the mailbox ran: {result.runs[0].mailbox_line or 'llama.cpp said nothing of it'}")
        print(f"{'PASS' if result.same_text else 'FAIL'}  the same text through the mailbox and the scheduler "
              f"({len(PROMPTS)} greedy completions)")
    return 0 if result.ok else 1
