"""``python -m llama_moe audit check|summary FILE``: the MoE cache's audit log (``--moe-cache-audit FILE``)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from ..server.audit import check_audit, format_summary, summarize


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("audit", help="check or summarize a --moe-cache-audit JSONL log")
    actions = p.add_subparsers(dest="audit_command", metavar="ACTION", required=True)
    c = actions.add_parser("check", help="validate every record and the invariants between them (exit 1 on errors)")
    c.add_argument("file", nargs="+", help="the audit log; several files are one rotated log, oldest first "
                                           "(a.jsonl.1 a.jsonl)")
    c.add_argument("--model", metavar="MODEL.gguf",
                   help="the model the log's server ran, when the path its load record names is not readable here: "
                   "its experts per layer bound the resident expert ids")
    c.add_argument("-q", "--quiet", action="store_true", help="print errors only")
    c.set_defaults(func=run_check)
    s = actions.add_parser("summary", help="one line per run: requests, hit rate, bytes moved")
    s.add_argument("file", nargs="+", help="the audit log; several files are one rotated log, oldest first")
    s.add_argument("--json", action="store_true", help="a JSON list of runs instead of the table")
    s.set_defaults(func=run_summary)


def run_check(args: argparse.Namespace) -> int:
    result = check_audit(args.file, args.model)
    for issue in result.issues:
        if issue.severity == "error" or not args.quiet:
            print(f"{issue.path or result.path}: {issue}")
    if not args.quiet:
        for note in result.notes:
            print(f"{result.path}: note: {note}")
    pids = ", ".join(map(str, sorted({run.pid for run in result.runs})))
    n, runs = len(result.errors), len(result.runs)
    verdict = "OK" if result.ok else f"{n} error{'s' if n > 1 else ''}"
    which = f" (pid {pids})" if pids else ""
    print(f"{result.path}: {result.n_records} records, {runs} run{'s' if runs != 1 else ''}{which}: {verdict}")
    return 0 if result.ok else 1


def run_summary(args: argparse.Namespace) -> int:
    runs = summarize(args.file)
    if args.json:
        json.dump([dataclasses.asdict(r) for r in runs], sys.stdout, indent=2)
        print()
    else:
        print(format_summary(runs))
    return 0
