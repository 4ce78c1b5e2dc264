"""``python -m llama_moe check-api --server URL``: a served model's OpenAI and Anthropic endpoints, with and
without the API key, through the official clients (``llama_moe.server.check_api``)."""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from ..server.check_api import check_api, reachable


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check-api", help="check a served model's OpenAI and Anthropic endpoints with the official clients")
    p.add_argument("--server", default="http://127.0.0.1:8080")
    p.add_argument("--api-key")
    p.add_argument("--model", default="default")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    reachable(args.server)
    checks = check_api(args.server, args.api_key, args.model)
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        for c in checks:
            print(f"{'PASS' if c.ok else 'FAIL'}  {c.name}: {c.detail}")
    return 0 if all(c.ok for c in checks) else 1
