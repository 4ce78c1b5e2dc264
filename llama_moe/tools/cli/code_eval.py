"""``python -m llama_moe code-eval MODEL [--suite smoke|hard] [--port 8099] [--max-tokens 700] [--no-server]``:
a smoke test of a model's (or a quantization's) coding. Serves MODEL as ``serve`` would (the cache fitted to
the GPU), or with ``--no-server`` uses the llama-server already listening on 127.0.0.1:PORT, sends six (smoke)
or ten harder (hard) Python tasks through the OpenAI chat endpoint, and runs each answer against asserts."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

import requests

from ..errors import CodeEvalError, ServerStartError
from ..server.code_eval import SUITES, evaluate, serve_and_evaluate
from ..server.http import request_error


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("code-eval", help="a smoke test of a served model's coding: Python tasks run against asserts")
    p.add_argument("model")
    p.add_argument("--suite", choices=sorted(SUITES), default="smoke", help="smoke: six tasks; hard: ten harder ones")
    p.add_argument("--port", type=int, default=8099)
    p.add_argument("--max-tokens", type=int, default=700)
    p.add_argument("--no-server", action="store_true", help="use the llama-server listening on 127.0.0.1:PORT")
    p.add_argument("--api-key")
    p.add_argument("--profile", help="serve with this MoE cache profile")
    p.add_argument("--hybrid", action="store_true", help="serve with --moe-cache-hybrid (with --profile)")
    p.add_argument("--ctx", type=int, default=4096)
    p.add_argument("--min-pass", type=int, default=0, help="exit 1 if fewer tasks pass (default 0: report only)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    if args.max_tokens < 1:
        raise CodeEvalError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if not 0 < args.port < 65536:
        raise CodeEvalError(f"--port must be from 1 to 65535, got {args.port}")
    url = f"http://127.0.0.1:{args.port}"
    tasks = SUITES[args.suite]
    try:
        if args.no_server:
            result = evaluate(url, tasks, args.suite, args.max_tokens, args.api_key, log)
        else:
            result = serve_and_evaluate(Path(args.model), tasks, args.suite, args.port, args.max_tokens, args.api_key,
                                        args.profile, args.hybrid, args.ctx, tuple(getattr(args, "passthrough", ())), log)
    except ServerStartError as exc:
        raise CodeEvalError(f"{url}: {exc}") from exc
    except requests.RequestException as exc:
        raise CodeEvalError(f"{url}: {request_error(exc)}") from exc
    if args.json:
        print(json.dumps(asdict(result) | {"n_passed": result.n_passed}, indent=2))
    else:
        print(f"{args.suite}: {result.n_passed} of {len(result.results)} tasks passed ({Path(args.model).name}, {url})")
    return 0 if result.n_passed >= args.min_pass else 1
