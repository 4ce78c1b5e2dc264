"""``python -m llama_moe plan MODEL (--vram-gib G | --cache-mib N) [--trace T.bin ...]``: the slots the engine
will give each layer for a budget, the profile to fill them from (--out), and the hit rate to expect,
held out by k-fold over the traces (one trace left out at a time, with two or more).

With the layers split across devices (--tensor-split, --rpc), --cache-mib is per device: each device's layers
get its slots, and the plan says per device its layers, slots, bytes and held-out hit rate."""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from ...errors import ParameterError, RpcServerError
from ..errors import ToolInputError
from ...formats.profile import write_profile
from ...policy_replay import max_ubatch
from ...params import check_tensor_split
from ..routing.placement import DeviceSplit, describe_budget, engine_devices, mirrored_devices
from ..routing.planning import Plan, plan_cache, vram_budget
from .common import add_output_options, emit, kfold_arg, model_layout, progress, rate, read_traces


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("plan", help="fit the MoE cache to a budget and rank its profile from traces",
                       description=__doc__.replace("``", ""))
    p.add_argument("model", help="a GGUF MoE model (the expert sizes are read from it)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--vram-gib", type=float,
                      help="the GPU's memory: the cache gets what the non-expert weights and the reserve leave")
    size.add_argument("--cache-mib", type=float, help="the cache size itself (--moe-cache-mib)")
    p.add_argument("--ram-mib", type=float, help="a RAM tier of this size (--moe-ram-mib): alone, upload mode's LRU in RAM, "
                                                 "whose misses are read from the model's file; with --cache-mib or "
                                                 "--vram-gib, under that cache (three tiers)")
    p.add_argument("--reserve-gib", type=float, default=2.0,
                   help="with --vram-gib: kept for the KV cache, compute buffers and the driver (default 2)")
    add_plan_options(p)
    p.add_argument("--trace", nargs="+", default=[], metavar="T.bin",
                   help="routing traces (python -m llama_moe trace) to rank the profile and score the plan")
    p.add_argument("--out", metavar="P.strp", help="write the profile (needs --trace)")
    add_split_options(p)
    add_output_options(p)
    p.set_defaults(func=run)


def add_plan_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--hybrid", action="store_true",
                   help="plan for --moe-cache-hybrid (one null slot per layer; scored by the static policy)")
    p.add_argument("--kfold", type=kfold_arg, metavar="K", help="folds of the held-out estimate: K contiguous blocks of "
                   "the tokens, or 'trace' (leave one trace out); default: one per trace with two or more traces, "
                   "else 10 contiguous blocks")
    p.add_argument("--whole-layers", type=int, default=0, metavar="N",
                   help="report the N layers that gain most from being held whole, and the same budget with them whole "
                   "(a report: the profile written does not carry it; --per-layer writes a split the engine takes)")
    p.add_argument("--per-layer", action="store_true",
                   help="split the same bytes across the layers by the routing's miss curves (plan: needs --trace): the slots per "
                   "layer in the report and its JSON (per_layer.slots), held out; the profile written (--out / -o) carries them, "
                   "and the engine sizes each layer from it")
    p.add_argument("--min-slots", type=int, default=None, metavar="N",
                   help="with --per-layer: each layer's least slots (default: k in upload mode, 1 with --hybrid)")


def add_split_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("layers split across devices (--cache-mib is then per device)")
    g.add_argument("--tensor-split", metavar="A,B,...", type=shares_arg, default=(),
                   help="each device's share of the layers, as llama.cpp's -ts and ModelParams.tensor_split; alone, the "
                   "engine's placement is worked out here (every layer offloaded; each device's free memory, which can "
                   "only lower its slots, is not known)")
    g.add_argument("--rpc", metavar="HOST:PORT,...", type=lambda t: tuple(x for x in t.split(",") if x), default=(),
                   help="rpc-servers whose devices take the layers (llama.cpp's --rpc, ModelParams.rpc): the model is "
                   "loaded there, its experts in RAM, and each device's layers and slots are read from the engine")
    g.add_argument("--engine", action="store_true",
                   help="read the placement from the engine on this machine's own devices (and --rpc's), the model "
                   "loaded with its experts in RAM, instead of working it out")


def shares_arg(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a comma-separated list of numbers, got {text!r}") from None


def split_devices(args: argparse.Namespace, layout, mib: float) -> list[DeviceSplit]:
    """The devices of a split (none without --tensor-split / --rpc / --engine): read from the engine, or mirrored."""
    if not (args.tensor_split or args.rpc or args.engine):
        return []
    if args.vram_gib is not None:
        raise ToolInputError("--vram-gib sizes a cache on one GPU: with the layers split across devices give "
                             "--cache-mib, the size on each device")
    if args.tensor_split:
        try:
            check_tensor_split(args.tensor_split)
        except ParameterError as exc:
            raise ToolInputError(f"--tensor-split: {exc}") from None
    if args.rpc or args.engine:
        try:
            return engine_devices(args.model, layout, mib, args.hybrid, args.rpc, args.tensor_split)
        except (ParameterError, RpcServerError) as exc:
            raise ToolInputError(str(exc)) from None
    return mirrored_devices(layout, args.tensor_split, mib, args.hybrid)


def plan_with_progress(args: argparse.Namespace, layout, mib: float, routes, budget: str,
                       devices: Sequence[DeviceSplit] = (), ram_mib: float | None = None):
    """plan_cache with the k-fold replays on a progress line (shared by plan and profile)."""
    bar = progress(args, "% of the k-fold replays", percent=True)
    try:
        return plan_cache(args.model, layout, mib, args.hybrid, routes, args.kfold, args.whole_layers, budget, bar,
                          args.per_layer, args.min_slots, devices, ram_mib)
    finally:
        bar.close()


def check_plan_options(args: argparse.Namespace) -> None:
    """Numbers no budget can mean, refused with the option's name (shared with ``profile``). Sizes stop at
    16 TiB, as ContextParams.moe_cache_mib does (beyond it the arithmetic overflows into nonsense)."""
    if args.min_slots is not None and not args.per_layer:
        raise ToolInputError("--min-slots sets the least slots of a per-layer split: give --per-layer")
    for flag, name, low, high in (("--cache-mib", "cache_mib", None, 1 << 24), ("--ram-mib", "ram_mib", None, 1 << 24),
                                  ("--vram-gib", "vram_gib", None, 1 << 14),
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

    three = args.ram_mib is not None and (args.cache_mib is not None or args.vram_gib is not None)
    if args.ram_mib is None and args.cache_mib is None and args.vram_gib is None:
        raise ToolInputError("give the cache's size: --vram-gib G, --cache-mib N or --ram-mib N")
    if three and (args.tensor_split or args.rpc or args.engine):
        raise ToolInputError("--ram-mib under a cache plans three tiers on one device: --tensor-split, --rpc and --engine "
                             "do not apply")
    if args.ram_mib is not None and not three:
        if args.hybrid or args.tensor_split or args.rpc or args.engine:
            raise ToolInputError("--ram-mib plans the RAM tier, an LRU in RAM on the CPU: --hybrid, --tensor-split, "
                                 "--rpc and --engine do not apply")
        mib, budget = args.ram_mib, ""
    elif args.cache_mib is not None:
        mib, budget = args.cache_mib, ""
    else:
        mib, budget = vram_budget(args.model, layout, args.vram_gib, args.reserve_gib)
    devices = split_devices(args, layout, mib)
    if devices:
        budget = describe_budget(mib, devices)
    routes = read_traces(args, args.trace, layout) if args.trace else None
    plan, profile = plan_with_progress(args, layout, mib, routes, budget, devices, args.ram_mib if three else None)
    if args.out and profile is not None:
        write_profile(args.out, profile)
    if three:
        emit(args, plan, lambda p: format_three_tiers(p, args.out))
    elif args.ram_mib is not None:
        emit(args, plan, lambda p: format_ram_tier(p, args.out))
    else:
        emit(args, plan, lambda p: format_plan(p, args.out))
    warn_json(args, plan)
    return 0


def warn_json(args: argparse.Namespace, plan: Plan) -> None:
    """The plan's warnings on stderr too when stdout is JSON (the text report has them in its lines)."""
    if args.json:
        for w in plan.warnings:
            print(f"warning: {w}", file=sys.stderr)


def format_devices(p: Plan) -> list[str]:
    if not p.devices:
        return []
    out = ["", f"device       layers  slots/layer  MiB (engine)  hit rate (held out)            misses/token"]
    for d in p.devices:
        rate_text = "n/a" if d.hit_rate is None else f"{d.hit_rate.mean:.4f} [{d.hit_rate.low:.4f}, {d.hit_rate.high:.4f}]"
        if d.hit_rate is None and d.pooled_hit_rate is not None:
            rate_text = f"{d.pooled_hit_rate:.4f} (pooled)"
        miss = "-" if d.misses_per_token is None else f"{d.misses_per_token:.3f}"
        out.append(f"{d.name:12s} {runs(d.layers):>6s}  {d.slots:11d}  {d.buffer_bytes / 2**20:12.2f}  {rate_text:29s}  {miss:>12s}"
                   + (f"  ({d.description})" if d.description else ""))
    return out


def runs(layers: Sequence[int]) -> str:
    """0-2,5: runs of consecutive layers, as the engine's log lines write them."""
    out, i = [], 0
    while i < len(layers):
        j = i
        while j + 1 < len(layers) and layers[j + 1] == layers[j] + 1:
            j += 1
        out.append(f"{layers[i]}-{layers[j]}" if j > i else f"{layers[i]}")
        i = j + 1
    return ",".join(out)


def format_ram_tier(p: Plan, profile_path: str | None) -> str:
    """The plan of a RAM tier: upload mode's, its budget named as the tier's, and its reads of the file as the
    engine's replay counts them: the misses uploaded into its slots and those its split reads for itself alone."""
    lines = format_plan(p, profile_path).split("\n")
    lines = [f"budget     --moe-ram-mib {p.cache_mib:g} (the RAM tier: upload mode's LRU per layer, in RAM)"
             if l.startswith("budget     ") else l for l in lines]
    at = max(i for i, l in enumerate(lines) if l.startswith(("budget", "slots", "held out", "in-sample"))) + 1
    upload, split = p.bytes_upload_per_token, p.bytes_cpu_per_token
    if upload is None or split is None:
        disk = "disk       no traces: give --trace T.bin to estimate the reads"
    else:
        parts = (f"{upload / 1e6:.2f} MB of misses read into the slots and {split / 1e6:.2f} MB its split reads for "
                 f"itself, a ubatch's experts beyond the slots" if split else "the misses read into the slots")
        disk = (f"disk       {(upload + split) / 1e6:.2f} MB read from the model's file per token, held out (the "
                f"engine's replay of decoding: {parts}; not counted: the profile's fill at load, and the prompts' "
                f"ubatches of over {max_ubatch()} tokens, read into a staging copy of one layer's experts)")
    lines.insert(at, disk)
    return "\n".join(lines)


def format_three_tiers(p: Plan, profile_path: str | None) -> str:
    """The plan of a cache over a RAM tier: the cache's plan, then the tier's line: its slots, the hit rate of its
    lookups (what the cache lacked) and its reads of the file per token, held out, as the engine's replay of both
    counts them."""
    lines = format_plan(p, profile_path).split("\n")
    at = max(i for i, l in enumerate(lines) if l.startswith(("budget", "slots", "held out", "in-sample"))) + 1
    head = f"RAM tier   --moe-ram-mib {p.ram_mib:g}: {p.ram_slots} slots per layer under the cache"
    if p.ram_hit_rate is None or p.ram_bytes_disk_per_token is None:
        tier = f"{head}; no traces: give --trace T.bin to estimate its hit rate and reads"
    else:
        r = p.ram_hit_rate
        tier = (f"{head}; of what the cache lacks it holds {r.mean:.4f} [{r.low:.4f}, {r.high:.4f}] held out, and reads "
                f"{p.ram_bytes_disk_per_token / 1e6:.2f} MB from the model's file per token (the engine's replay of both "
                f"tiers; not counted: the fill at load, and the prompts' ubatches of over {max_ubatch()} tokens)")
    lines.insert(at, tier)
    return "\n".join(lines)


def format_plan(p: Plan, profile_path: str | None) -> str:
    mode = "hybrid" if p.hybrid else "upload"
    lines = [
        f"model      {p.model}: {p.n_layers} MoE layers x {p.n_expert} experts, {p.n_expert_used} per token; "
        f"one slot in every layer is {p.slot_row_bytes / 2**20:.3f} MiB",
        (f"budget     {p.budget} ({mode} mode)" if p.devices else
         f"budget     {p.budget + ' -> ' if p.budget else ''}--moe-cache-mib {p.cache_mib:g} ({mode} mode)"),
        (f"slots      {'-'.join(sorted({str(d.slots) for d in p.devices}, key=int))} per layer by device (below), "
         f"{sum(l.slots for l in p.layers)} in all (each device gives its layers the same"
         f"{'; the profile carries the per-layer split below, within each device' if p.per_layer else ''}); " if p.devices else
         f"slots      {p.slots} per layer, {p.slots * p.n_layers} in all ("
         f"{'equal slots; the profile carries the per-layer split below' if p.per_layer else 'the engine gives every cached layer the same'}); ")
        +
        f"{p.n_whole} layers held whole; the engine allocates {p.buffer_bytes / 2**20:.2f} MiB",
    ]
    if p.profile_pairs is not None:
        where = f"{profile_path}: " if profile_path else "(not written: --out P.strp) "
        lines.append(f"profile    {where}{p.profile_pairs} pairs, hottest first; the engine fills {p.n_prefilled} "
                     f"of the {sum(l.slots for l in p.layers if not l.whole)} slots it looks up from it at load")
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
    lines += format_devices(p)
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
        def est(e, digits: int = 4) -> str:
            return "n/a" if e is None else f"{e.mean:.{digits}f} [{e.low:.{digits}f}, {e.high:.{digits}f}]"
        counts = [s.slots[l.il] for l in p.layers]
        lines += ["", f"per layer  ({s.note})",
                  f"  {sum(counts)} slots in all split by the layers' {s.curve} miss curves, each at least "
                  f"{s.min_slots}: {min(counts)} to {max(counts)} per layer",
                  f"  held out (each fold split on the others' curves; misses per token and the share of the selected "
                  f"experts resident count every selection, a layer held whole as resident: the same lookups for both)",
                  f"    per-layer split  {est(s.misses, 3)} misses/token (pooled {s.misses_per_token:.3f}), "
                  f"resident {est(s.resident)}",
                  f"    equal slots      {est(s.uniform_misses, 3)} misses/token (pooled "
                  f"{s.uniform_misses_per_token:.3f}), resident {est(s.uniform_resident)}",
                  "  slots: " + " ".join(f"{il}:{s.slots[il]}" for il in sorted(s.slots))]
    w = p.whole_layers
    if w is not None:
        lines += ["", f"whole layers ({w.note})"]
        for x in w.layers:
            lines.append(f"  layer {x.il:3d}: {x.misses_per_token:.3f} misses/token removed for {x.extra_mib:.2f} MiB more")
        if w.resident_share is not None and w.uniform_share is not None:
            names = ("layer " if len(w.layers) == 1 else "layers ") + ", ".join(str(x.il) for x in w.layers)
            others = "no other layers" if w.other_slots is None else f"the others {w.other_slots} slots each"
            lines.append(f"  with {names} held whole, the same budget leaves {others}: selected experts resident "
                         f"{w.resident_share.mean:.4f} [{w.resident_share.low:.4f}, {w.resident_share.high:.4f}] held out, "
                         f"against {w.uniform_share.mean:.4f} [{w.uniform_share.low:.4f}, {w.uniform_share.high:.4f}] "
                         f"with the same slots everywhere")
        elif w.layers:
            lines.append("  holding them whole would leave less than one slot for the other layers")
    return "\n".join(lines)
