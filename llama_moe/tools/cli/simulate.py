"""``python -m llama_moe simulate MODEL --cache-mib N [N...] --train T.bin (--test H.bin | --kfold K)``: replays
held-out routing through the cache policies at each size: lru (the upload mode), static (the hybrid from
a profile), adaptive (the hybrid that swaps hot experts in) and belady (the ceiling). The policies the engine runs
(lru, static, adaptive, admitN, admitN-repartR) are replayed by the engine itself: its cache's own policy objects,
fed the routing as a context's cache is fed it; the simulator-only ones (belady, admitN-lrfu), which the engine
does not run, are the simulator's. Profiles are ranked on the train traces and scored on the test traces, or by
k-fold over the train traces (one trace left out at a time, with two or more); an in-sample figure is printed
beside them for contrast only."""
from __future__ import annotations

import argparse

from .common import add_output_options, check_files, emit, kfold_arg, model_layout, progress, rate, read_traces
from ..errors import ToolInputError
from ..routing.heldout import Estimate
from ..routing.policies import ALL_POLICIES, POLICIES, SIMULATOR_ONLY, PolicyResult, describe
from ..routing.simulation import SimulateReport, SizeResult, simulate_sizes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("simulate", help="replay held-out routing through the cache policies at several sizes",
                       description=__doc__.replace("``", ""))
    p.add_argument("model", help="a GGUF MoE model (the expert sizes are read from it)")
    p.add_argument("--cache-mib", type=float, nargs="+", required=True, metavar="N", help="cache sizes to simulate")
    p.add_argument("--train", nargs="+", required=True, metavar="T.bin", help="traces to rank profiles on")
    p.add_argument("--test", nargs="+", default=[], metavar="H.bin", help="held-out traces to score on")
    p.add_argument("--kfold", type=kfold_arg, nargs="?", const="auto", metavar="K",
                   help="also (or instead) k-fold over the train traces: alone, one fold per trace with two or more "
                   "traces (leave one out), else 10 contiguous blocks; K: K contiguous blocks of the tokens; 'trace': "
                   "one per trace")
    p.add_argument("--hybrid", action="store_true", help="slots as --moe-cache-hybrid computes them (one null slot per layer)")
    p.add_argument("--policies", default=",".join(POLICIES),
                   help=f"comma-separated, from {','.join(ALL_POLICIES)} (default: {','.join(POLICIES)}); the engine replays "
                   f"all but the simulator-only {','.join(SIMULATOR_ONLY)}")
    add_output_options(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    for mib in args.cache_mib:  # as plan's --cache-mib
        if not 0 < mib <= 1 << 24:  # also NaN and infinity
            raise ToolInputError(f"--cache-mib must be > 0 and at most {1 << 24}, got {mib:g}")
    if isinstance(args.kfold, int) and args.kfold < 2:  # a number of folds; "trace" and "auto" are checked later
        raise ToolInputError(f"--kfold must be >= 2, got {args.kfold}")
    layout = model_layout(args.model)
    if not args.test and not args.kfold:
        raise ToolInputError("a hit rate must be held out: give --test H.bin, or --kfold K (an in-sample one alone misleads)")
    policies = tuple(x.strip() for x in args.policies.split(",") if x.strip())
    unknown = [x for x in policies if x not in ALL_POLICIES]
    if unknown or not policies:
        raise ToolInputError(f"unknown policies {unknown}; choose from {', '.join(ALL_POLICIES)}")
    check_files(args.train + args.test)
    train = read_traces(args, args.train, layout)
    test = read_traces(args, args.test, layout) if args.test else None
    bar = progress(args, "% of the replays", percent=True)
    try:
        report = simulate_sizes(args.model, layout, args.cache_mib, train, test, args.kfold, args.hybrid, policies, bar)
    finally:
        bar.close()
    emit(args, report, format_report)
    return 0


def _notes(r: PolicyResult) -> str:
    notes = []
    if r.n_slots and r.n_resident < r.n_slots:
        notes.append(f"{r.n_resident}/{r.n_slots} slots filled")
    if r.n_cpu:
        notes.append(f"{r.n_cpu} misses computed on the CPU in {r.n_split_lookups} lookups (more distinct experts "
                     f"than slots: the split)")
    if r.policy == "adaptive":
        notes.append(f"{r.n_swap} swaps, {r.n_fill} fills")
    elif r.policy.startswith("admit"):
        notes.append(f"{r.n_swap} admitted")
        if r.n_repartition:
            notes.append(f"{r.n_moved} slots moved in {r.n_repartition} rounds")
    return "; ".join(notes)


def format_report(r: SimulateReport) -> str:
    mode = "hybrid" if r.hybrid else "upload"
    lines = [f"model      {r.model}: {r.n_expert} experts, {r.n_expert_used} per token; slots as the {mode} mode computes them",
             f"routing    train {r.train_tokens} tokens" + (f", test {r.test_tokens} tokens" if r.test_tokens else ""),
             *([f"held out   test: {r.held_out_test}"] if r.test_tokens else []),
             *([f"held out   k-fold: {r.held_out_kfold or f'{r.folds} folds'}; mean [95% Student t interval over the folds]"]
               if r.folds else []),
             "           each token is its own ubatch, as in generation; hit rate = hits / (hits + misses) of "
             "the distinct experts looked up, the misses upload mode computes on the CPU included (n/a: nothing "
             "looked up); h_layer = share of (layer, token) with all its experts resident", ""]
    head = f"{'MiB':>8s} {'slots':>5s}  {'policy':{_width(r)}s}"
    if r.test_tokens:
        head += f"  {'hit rate':>8s}  {'h_layer':>7s}"
    if r.folds:
        head += f"  {'k-fold hit rate':<22s}  {'k-fold h_layer':<22s}"
    lines.append(head + "  notes")
    for s in r.sizes:
        lines += _size_lines(r, s)
    return "\n".join(lines)


def _size_lines(r: SimulateReport, s: SizeResult) -> list[str]:
    if s.whole:
        return [f"{s.cache_mib:8.2f} {s.slots:5d}  every layer held whole: no lookups, every expert resident"]
    out, w = [], _width(r)
    for i, name in enumerate(r.policies):
        line = f"{s.cache_mib:8.2f} {s.slots:5d}  {name:{w}s}" if i == 0 else f"{'':8s} {'':5s}  {name:{w}s}"
        result = None
        if s.heldout is not None:
            result = s.heldout[name]
            line += f"  {rate(result.hit_rate):>8s}  {rate(result.h_layer):>7s}"
        if s.kfold is not None:
            k = s.kfold[name]
            line += f"  {_interval(k.hit_rate):<22s}  {_interval(k.h_layer):<22s}"
            result = result or k.pooled
        short = s.kfold[name].short_note() if s.kfold is not None else ""
        notes = [x for x in (_notes(result) if result else "", short and f"k-fold: {short}") if x]
        out.append(line + f"  {describe(name)}" + "".join(f"; {x}" for x in notes))
    if s.in_sample is not None:
        out.append(f"{'':8s} {'':5s}  {'':{w}s}  in-sample static {rate(s.in_sample.hit_rate).strip()} (the profile on "
                   f"its own train routing: optimistic, for contrast only)")
    return out


def _width(r: SimulateReport) -> int:
    """The policy column's width: the longest name asked for, at least 8."""
    return max(8, *(len(x) for x in r.policies))


def _interval(e: Estimate | None) -> str:
    return "n/a" if e is None else f"{e.mean:.4f} [{e.low:.4f},{e.high:.4f}]"
