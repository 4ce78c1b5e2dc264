"""``python -m llama_moe serve MODEL``: starts llama-server with the MoE cache sized to the GPU's free memory
(measured by llama-server at load: ``--moe-cache-mib auto``) in the fastest mode measured (``--moe-cache-mode
auto``), see ``llama_moe.tools.server.plan``. ``--dry-run`` prints the plan and the exact command."""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
from pathlib import Path

from ..server.plan import API_KEY_ENV, plan_for_gpu
from ..server.process import run_in_foreground


def _auto_or_int(text: str) -> str | int:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"auto or a whole number, not {text!r}") from None


def _auto_or_mib(text: str) -> str | float:
    if text == "auto":
        return text
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"auto or a number of MiB, not {text!r}") from None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="start llama-server with the MoE cache fitted to the GPU (flags after -- go to it)")
    p.add_argument("model")
    p.add_argument("--profile")
    p.add_argument("--ubatch", default="auto", type=_auto_or_int, help="auto or a number")
    p.add_argument("--favor", choices=["prompt", "generation"], default="generation")
    p.add_argument("--min-cache-mib", type=float, default=1500)
    p.add_argument("--cache-mib", type=_auto_or_mib, help="the cache's size in MiB, or auto (the default on a GPU: what "
                   "the GPU has free once llama-server has loaded the model, the KV cache and the compute buffers, less "
                   "--margin-mib, measured at load); without a GPU, with --cache-device CPU, the cache in RAM at this size")
    p.add_argument("--cache-device", metavar="DEVICE", help="the device that holds the cache (--moe-cache-device; CPU: in "
                   "RAM, which checks the cache and makes nothing faster; default: the GPU)")
    p.add_argument("--margin-mib", type=float, default=400, help="the GPU memory left free beside the cache (default 400)")
    p.add_argument("--mode", choices=["auto", "upload", "hybrid", "adaptive", "admit"],
                   help="--moe-cache-mode (default: auto, the hybrid admitting its misses, the fastest measured)")
    p.add_argument("--hybrid", action="store_true", help="--moe-cache-hybrid (with --profile): --mode hybrid")
    p.add_argument("--api-key", help=f"the key clients must send; it reaches llama-server in ${API_KEY_ENV}, never "
                                      f"on its command line (default: ${API_KEY_ENV}; set it there, and this command's "
                                      f"own command line hides it too)")
    p.add_argument("--alias")
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (default 127.0.0.1; another, such as "
                   "0.0.0.0, without an API key is warned about)")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--ctx", type=int, default=32768)
    p.add_argument("--parallel", type=int, default=1)
    p.add_argument("--threads", default="auto", type=_auto_or_int)
    p.add_argument("--dry-run", action="store_true", help="print the plan and the command, start nothing")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    extra = tuple(getattr(args, "passthrough", ()))  # after "--" on the command line
    if args.api_key:
        logging.getLogger(__name__).warning("serve: --api-key shows the key to every user in ps while this command runs; "
                                            "set %s instead", API_KEY_ENV)
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    plan = plan_for_gpu(Path(args.model), n_ctx=args.ctx, parallel=args.parallel, favor=args.favor,
                        ubatch=None if args.ubatch == "auto" else int(args.ubatch),
                        cache_mib=None if args.cache_mib in (None, "auto") else args.cache_mib,
                        cache_auto=True if args.cache_mib == "auto" else None, mode=args.mode,
                        min_cache_mib=args.min_cache_mib, margin_mib=args.margin_mib, profile=args.profile,
                        hybrid=args.hybrid, api_key=api_key, alias=args.alias, host=args.host, port=args.port,
                        threads=None if args.threads == "auto" else int(args.threads), cache_device=args.cache_device,
                        extra=extra)
    if args.json:
        print(json.dumps(dataclasses.asdict(plan), indent=2))
    else:
        print(plan.describe(), file=sys.stderr if not args.dry_run else sys.stdout)
    if args.json or args.dry_run:  # the plan's text on stderr has them already
        for w in plan.warnings:
            logging.getLogger(__name__).warning("serve: warning: %s", w)
    if args.dry_run:
        return 0
    return run_in_foreground(plan.command, {API_KEY_ENV: api_key} if api_key else None)
