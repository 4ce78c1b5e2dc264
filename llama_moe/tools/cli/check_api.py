"""``python -m llama_moe check-api MODEL PROFILE [--cache-mib N]`` (start a server with the cache, check it, stop
it) or ``check-api --server URL`` (a running one): the OpenAI and Anthropic endpoints, with and without the API
key, through the official clients, and the MoE cache's series (``llama_moe.tools.server.check_api``)."""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict

from ...errors import ParameterError
from ..server.check_api import check_api, reachable, serve_and_check
from ..server.plan import API_KEY_ENV


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check-api", help="check a served model's OpenAI and Anthropic endpoints with the official "
                                         "clients, its key and its MoE cache's series")
    p.add_argument("model", nargs="?", help="serve this model with the cache for the check (with PROFILE)")
    p.add_argument("profile", nargs="?", help="the STRP profile the cache is filled from")
    p.add_argument("--cache-mib", type=float, help="with MODEL: the cache's size (default 256)")
    p.add_argument("--server", help="check this running server instead (default http://127.0.0.1:8080)")
    p.add_argument("--api-key", help=f"the server's key (default: ${API_KEY_ENV})")
    p.add_argument("--model", dest="model_name", default="default", help="the model name to ask for (--server)")
    p.add_argument("--no-cache-check", action="store_true", help="--server: skip the MoE cache's series")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.model is not None:
        if args.profile is None:
            raise ParameterError("check-api MODEL needs PROFILE too (check-api MODEL PROFILE [--cache-mib N]), "
                                 "or check a running server with --server URL")
        for given, name in ((args.server, "--server"), (args.api_key, "--api-key"), (args.no_cache_check,
                                                                                      "--no-cache-check")):
            if given:
                raise ParameterError(f"{name} checks a running server; with MODEL PROFILE check-api starts its own")
        log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
        checks = serve_and_check(args.model, args.profile, 256 if args.cache_mib is None else args.cache_mib, log=log)
    else:
        if args.cache_mib is not None:
            raise ParameterError("--cache-mib sizes the cache of the server check-api MODEL PROFILE starts; "
                                 "a running server's cache is its own")
        server = args.server or "http://127.0.0.1:8080"
        reachable(server)
        key = args.api_key or os.environ.get(API_KEY_ENV) or None
        checks = check_api(server, key, args.model_name, cache=not args.no_cache_check)
    if args.json:
        print(json.dumps([asdict(c) for c in checks], indent=2))
    else:
        for c in checks:
            print(f"{'PASS' if c.ok else 'FAIL'}  {c.name}: {c.detail}")
    return 0 if all(c.ok for c in checks) else 1
