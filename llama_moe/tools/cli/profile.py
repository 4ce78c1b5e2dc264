"""``python -m llama_moe profile MODEL TEXT.txt [-o P.strp]``: the tracer and the planner in one command.
Traces the text, writes the profile (every selected pair, hottest first: it serves any cache size) and
prints the plan for one size with its held-out hit rate."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..errors import ToolInputError
from ...formats.profile import write_profile
from ..routing.planning import slots_budget
from ..routing.routes import routes_from_records
from ..routing.tracing import DEFAULT_UBATCH, trace_text
from ...formats.trace import write_trace
from .common import add_output_options, check_output_file, emit, model_layout, progress, read_text
from .plan import add_plan_options, check_plan_options, format_plan, plan_with_progress, warn_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("profile", help="trace a text and write the MoE cache profile ranked from it",
                       description=__doc__.replace("``", ""))
    p.add_argument("model", help="a GGUF MoE model")
    p.add_argument("text", help="a UTF-8 text like the one the model will serve")
    p.add_argument("-o", "--out", metavar="P.strp", help="the profile to write (default: the model's path with .strp)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--slots", type=int, help="score the profile for this many slots per layer (default: a quarter of the experts)")
    size.add_argument("--cache-mib", type=float, help="score the profile for this cache size")
    add_plan_options(p)
    p.add_argument("--trace-out", metavar="T.bin", help="also keep the routing trace")
    p.add_argument("-c", "--ctx", type=int, default=4096, help="context size of the tracing windows (default 4096)")
    p.add_argument("-t", "--threads", type=int, help="CPU threads (default: one per core)")
    p.add_argument("--ubatch", type=int, default=DEFAULT_UBATCH, help=f"tokens per decode while tracing (default {DEFAULT_UBATCH})")
    add_output_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    check_plan_options(args)
    if args.slots is not None and args.slots < 1:
        raise ToolInputError(f"--slots must be >= 1, got {args.slots}")
    layout = model_layout(args.model)
    text = read_text(args.text)
    out = args.out or str(Path(args.model).with_suffix(".strp"))
    check_output_file(out, "-o/--out")  # the default beside the model too, before the tracing
    if args.cache_mib is not None:
        mib, budget = args.cache_mib, ""
    else:
        mib, budget = slots_budget(layout, args.slots, args.hybrid)
    bar = progress(args, "tokens traced")
    try:
        records = trace_text(args.model, text, args.ctx, args.threads, args.ubatch, bar)
    finally:
        bar.close()
    if args.trace_out:
        write_trace(args.trace_out, records)
    # generation meets the cache one token at a time: score (and rank) per token, as a trace file is read
    routes = routes_from_records(records).per_token()
    plan, profile = plan_with_progress(args, layout, mib, routes, budget)
    assert profile is not None  # routing was given
    write_profile(out, profile)
    emit(args, plan, lambda p: format_plan(p, out))
    warn_json(args, plan)
    return 0
