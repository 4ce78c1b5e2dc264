"""``python -m llama_moe plan MODEL (--vram-gib G | --cache-mib N) [--trace T.bin ...]``: the slots the engine
will give each layer for a budget, the profile to fill them from (--out), and the hit rate to expect,
held out by k-fold over the traces (one trace left out at a time, with two or more)."""
from __future__ import annotations

import argparse
import sys

from ..errors import ToolInputError
from ..formats.profile import write_profile
from ..routing.planning import Plan, plan_cache, vram_budget
from .common import add_output_options, emit, kfold_arg, model_layout, progress, rate, read_traces


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="fit the MoE cache to a budget and rank its profile from traces",
                       description=__doc__.replace("``", ""))
    p.add_argument("model", help="a GGUF MoE model (the expert sizes are read from it)")
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--vram-gib", type=float,
                      help="the GPU's memory: the cache gets what the non-expert weights and the reserve leave")
    size.add_argument("--cache-mib", type=float, help="the cache size itself (--moe-cache-mib)")
    p.add_argument("--reserve-gib", type=float, default=2.0,
                   help="with --vram-gib: kept for the KV cache, compute buffers and the driver (default 2)")
    add_plan_options(p)
    p.add_argument("--trace", nargs="+", default=[], metavar="T.bin",
                   help="routing traces (python -m llama_moe trace) to rank the profile and score the plan")
    p.add_argument("--out", metavar="P.strp", help="write the profile (needs --trace)")
    add_output_options(p)
    p.set_defaults(func=run)


def add_plan_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hybrid", action="store_true",
                   help="plan for --moe-cache-hybrid (one null slot per layer; scored by the static policy)")
    p.add_argument("--kfold", type=kfold_arg, metavar="K", help="folds of the held-out estimate: K contiguous blocks of "
                   "the tokens, or 'trace' (leave one trace out); default: one per trace with two or more traces, "
                   "else 10 contiguous blocks")
    p.add_argument("--whole-layers", type=int, default=0, metavar="N", help="report the N layers that gain most from being held whole")
    p.add_argument("--per-layer", action="store_true",
                   help="split the same bytes across the layers by the routing's miss curves (plan: needs --trace): the slots per "
                   "layer in the report and its JSON (per_layer.slots), held out; the profile written (--out / -o) carries them, "
                   "and the engine sizes each layer from it")
    p.add_argument("--min-slots", type=int, default=None, metavar="N",
                   help="with --per-layer: each layer's least slots (default: k in upload mode, 1 with --hybrid)")


def plan_with_progress(args: argparse.Namespace, layout, mib: float, routes, budget: str):
    """plan_cache with the k-fold replays on a progress line (shared by plan and profile)."""
    bar = progress(args, "% of the k-fold replays", percent=True)
    try:
        return plan_cache(args.model, layout, mib, args.hybrid, routes, args.kfold, args.whole_layers, budget, bar,
                          args.per_layer, args.min_slots)
    finally:
        bar.close()


def check_plan_options(args: argparse.Namespace) -> None:
    """Numbers no budget can mean, refused with the option's name (shared with ``profile``). Sizes stop at
    16 TiB, as ContextParams.moe_cache_mib does (beyond it the arithmetic overflows into nonsense)."""
    if args.min_slots is not None and not args.per_layer:
        raise ToolInputError("--min-slots sets the least slots of a per-layer split: give --per-layer")
    for flag, name, low, high in (("--cache-mib", "cache_mib", None, 1 << 24), ("--vram-gib", "vram_gib", None, 1 << 14),
                                  ("--reserve-gib", "reserve_gib", 0, 1 << 14), ("--whole-layers", "whole_layers", 0, None),
                                  ("--kfold", "kfold", 2, None), ("--min-slots", "min_slots", 1, None)):
        value = getattr(args, name, None)
        if value is None or isinstance(value, str):  # --kfold trace / auto
            continue
        if low is None and not value > 0:  # also NaN
            raise ToolInputError(f"{flag} must be > 0, got {value:g}")
        if low is not None and not value >= low:
            raise ToolInputError(f"{flag} must be >= {low}, got {value:g}")
        if high is not None and not value <= high:  # also infinity
            raise ToolInputError(f"{flag} must be at most {high}, got {value:g}")


def run(args: argparse.Namespace) -> int:
    check_plan_options(args)
    layout = model_layout(args.model)
    if args.out and not args.trace:
        raise ToolInputError("--out writes a profile ranked from routing: give --trace T.bin")

    if args.cache_mib is not None:
        mib, budget = args.cache_mib, ""
    else:
        mib, budget = vram_budget(args.model, layout, args.vram_gib, args.reserve_gib)
    routes = read_traces(args, args.trace, layout) if args.trace else None
    plan, profile = plan_with_progress(args, layout, mib, routes, budget)
    if args.out and profile is not None:
        write_profile(args.out, profile)
    emit(args, plan, lambda p: format_plan(p, args.out))
    warn_json(args, plan)
    return 0


def warn_json(args: argparse.Namespace, plan: Plan) -> None:
    """The plan's warnings on stderr too when stdout is JSON (the text report has them in its lines)."""
    if args.json:
        for w in plan.warnings:
            print(f"warning: {w}", file=sys.stderr)


def format_plan(p: Plan, profile_path: str | None) -> str:
    mode = "hybrid" if p.hybrid else "upload"
    lines = [
        f"model      {p.model}: {p.n_layers} MoE layers x {p.n_expert} experts, {p.n_expert_used} per token; "
        f"one slot in every layer is {p.slot_row_bytes / 2**20:.3f} MiB",
        f"budget     {p.budget + ' -> ' if p.budget else ''}--moe-cache-mib {p.cache_mib:g} ({mode} mode)",
        f"slots      {p.slots} per layer, {p.slots * p.n_layers} in all ("
        f"{'equal slots; the profile carries the per-layer split below' if p.per_layer else 'the engine gives every cached layer the same'}); "
        f"{p.n_whole} layers held whole; the engine allocates {p.buffer_bytes / 2**20:.2f} MiB",
    ]
    if p.profile_pairs is not None:
        where = f"{profile_path}: " if profile_path else "(not written: --out P.strp) "
        lines.append(f"profile    {where}{p.profile_pairs} pairs, hottest first; the engine fills {p.n_prefilled} "
                     f"of the {p.slots * (p.n_layers - p.n_whole)} slots it looks up from it at load")
    if p.trace_tokens and p.hit_rate is not None and p.h_layer is not None:
        lines += [
            f"held out   hit rate {p.hit_rate.mean:.4f} [{p.hit_rate.low:.4f}, {p.hit_rate.high:.4f}], "
            f"h_layer {p.h_layer.mean:.4f} [{p.h_layer.low:.4f}, {p.h_layer.high:.4f}]  "
            f"({p.held_out or f'{p.folds} folds'}; {p.trace_tokens} tokens, {p.policy} policy, {p.hit_rate.method}; "
            f"hit rate = hits / (hits + misses))",
            f"in-sample  hit rate {rate(p.in_sample_hit_rate).strip()} (the profile scored on the text it was ranked "
            f"on: optimistic, for contrast only)",
        ]
    elif p.trace_tokens:
        lines.append("held out   hit rate n/a: nothing is looked up (every layer held whole)")
    else:
        lines.append("held out   no traces: give --trace T.bin to rank a profile and estimate the hit rate")
    lines += [f"warning    {w}" for w in p.warnings]
    splitting = any(l.cpu_per_token for l in p.layers)  # upload mode's split: misses computed on the CPU
    lines += ["", "layer  slots  hit rate (held out)  misses/token" + ("  of them on the CPU" if splitting else "")]
    for l in p.layers:
        miss = "-" if l.misses_per_token is None else f"{l.misses_per_token:.3f}"
        line = f"{l.il:5d}  {l.slots:5d}  {'whole' if l.whole else rate(l.hit_rate):>19s}  {miss:>12s}"
        if splitting:
            line += f"  {l.cpu_per_token or 0:19.3f}"
        lines.append(line)
    s = p.per_layer
    if s is not None:
        def est(e) -> str:
            return "n/a" if e is None else f"{e.mean:.4f} [{e.low:.4f}, {e.high:.4f}]"
        counts = [s.slots[l.il] for l in p.layers]
        lines += ["", f"per layer  ({s.note})",
                  f"  {sum(counts)} slots in all split by the layers' {s.curve} miss curves, each at least "
                  f"{s.min_slots}: {min(counts)} to {max(counts)} per layer",
                  f"  held out (each fold split on the others' curves): hit rate {est(s.hit_rate)}, "
                  f"{s.misses_per_token:.3f} misses/token; equal slots: {est(s.uniform_hit_rate)}, "
                  f"{s.uniform_misses_per_token:.3f} misses/token",
                  "  slots: " + " ".join(f"{il}:{s.slots[il]}" for il in sorted(s.slots))]
    w = p.whole_layers
    if w is not None:
        lines += ["", f"whole layers ({w.note})"]
        for x in w.layers:
            lines.append(f"  layer {x.il:3d}: {x.misses_per_token:.3f} misses/token removed for {x.extra_mib:.2f} MiB more")
        if w.resident_share is not None:
            names = ("layer " if len(w.layers) == 1 else "layers ") + ", ".join(str(x.il) for x in w.layers)
            others = "no other layers" if w.other_slots is None else f"the others {w.other_slots} slots each"
            lines.append(f"  with {names} held whole, the same budget leaves {others}: selected experts resident "
                         f"{w.resident_share.mean:.4f} [{w.resident_share.low:.4f}, {w.resident_share.high:.4f}] held out, "
                         f"against {w.uniform_share.mean:.4f} [{w.uniform_share.low:.4f}, {w.uniform_share.high:.4f}] "
                         f"with the same slots everywhere")
        elif w.layers:
            lines.append("  holding them whole would leave less than one slot for the other layers")
    return "\n".join(lines)
