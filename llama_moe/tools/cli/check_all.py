"""``python -m llama_moe check-all [MODEL] [--cpu-only]``: every check of an installation, CPU then GPU, on MODEL
(default: the embedded tiny model; ``llama_moe.tools.server.check_all``)."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from ...errors import LlamaMoeError
from ..server.check_all import check_all


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check-all", help="every check of this installation, CPU then GPU, on the default model or MODEL")
    p.add_argument("model", nargs="?")
    p.add_argument("--cpu-only", action="store_true", help="stop after the CPU checks")
    p.add_argument("-n", type=int, default=48, help="greedy tokens per decoding check (default 48)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.n < 1:
        raise LlamaMoeError(f"-n must be >= 1, got {args.n}")
    log = lambda s: print(s, file=sys.stderr if args.json else sys.stdout, flush=True)  # noqa: E731
    checks = check_all(args.model, args.cpu_only, args.n, log)
    failed = [c for c in checks if c.status == "FAIL"]
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        passed = sum(c.status == "PASS" for c in checks)
        print(f"{passed} passed, {len(failed)} failed, {len(checks) - passed - len(failed)} skipped")
    return 1 if failed else 0
