"""``python -m llama_moe <command>``: each command lives in its own module and registers itself here."""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Callable

from .errors import LlamaMoeError


def _commands() -> list[Callable[[argparse._SubParsersAction], None]]:
    from .commands import (audit, bench, bench_adaptive, build_cmd, check_all, check_api, check_audit, code_eval, info, monitor,
                           plan, predict, profile, serve, simulate, stats, trace)
    from .synth import cli as synth_cli

    return [stats.register, build_cmd.register, synth_cli.register, synth_cli.register_report, bench.register, serve.register, check_api.register,
            info.register, audit.register, monitor.register, trace.register, profile.register, plan.register,
            simulate.register, predict.register, bench_adaptive.register, check_audit.register, code_eval.register, check_all.register]


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m llama_moe", description="MoE inference with a VRAM expert cache")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv: llama.cpp's debug log)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in _commands():
        register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = make_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    # everything after "--" is passed on as it is (serve hands it to llama-server)
    passthrough: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, passthrough = argv[:cut], argv[cut + 1:]
    args = parser.parse_args(argv)
    args.passthrough = passthrough
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    level = logging.WARNING - 10 * min(args.verbose, 2) if args.verbose else logging.INFO
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # the API clients log every request at INFO
    # llama.cpp's own log is loud at INFO; show its warnings unless asked for more.
    logging.getLogger("llama_moe.native").setLevel(logging.DEBUG if args.verbose >= 2 else
                                                   logging.INFO if args.verbose else logging.WARNING)
    try:
        return int(args.func(args) or 0)
    except LlamaMoeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
