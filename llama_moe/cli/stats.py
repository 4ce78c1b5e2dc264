"""``python -m llama_moe stats [MODEL]``: the main job. Runs a prompt and a generation with the experts in
RAM and reports what happened: throughput, the model's MoE geometry and where its experts were."""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

from ..context import Context, Sampling
from ..default_model import default_model_path, default_prompt
from ..experts import ExpertLayout, expert_layout
from ..model import Model
from ..errors import MoeCacheWarning, ParameterError, ServerError
from ..params import ContextParams, ModelParams
from ..server_metrics import MoeCacheMetrics, ServerMetrics, fetch_server_metrics
from ..stats import LayerStats, MoeCacheStats, lookups_line


@dataclass(frozen=True)
class StatsReport:
    model: str
    description: str
    library: str
    variant: str
    experts_in_ram: str
    layout: ExpertLayout
    n_prompt: int
    n_gen: int
    prompt_tps: float
    gen_tps: float
    text: str
    cache: MoeCacheStats | None
    cache_layers: tuple[LayerStats, ...]
    cache_off_reason: str | None = None  # a cache was asked for, and llama.cpp went on without it: why


def run_stats(model_path: Path, model_params: ModelParams, ctx_params: ContextParams, prompt: str,
              n_gen: int, sampling: Sampling) -> StatsReport:
    from .. import _loader

    layout = expert_layout(model_path)
    with Model(model_path, model_params) as model:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MoeCacheWarning)  # the report says it (cache_off_reason)
            ctx = Context(model, ctx_params)
        with ctx:
            # A warm-up decode, so that one-time allocations do not count against the prompt.
            ctx.decode(model.tokenize("warm up"))
            ctx.reset()
            ctx.reset_perf()
            completion = ctx.complete(prompt, n_gen, sampling, stop_at_eog=False)  # always n_gen tokens, like llama-bench
            perf = ctx.perf()
            placement = ("all layers (cpu_moe)" if model_params.cpu_moe else
                         f"layers 0..{model_params.n_cpu_moe - 1} (n_cpu_moe)" if model_params.n_cpu_moe else
                         "none (experts on the default device)")
            manifest = _loader.manifest()
            return StatsReport(str(model_path), model.description, str(_loader.library_path()),
                               manifest.get("variant", "?"), placement, layout, perf.n_prompt, perf.n_gen,
                               perf.prompt_tps, perf.gen_tps, completion.text, ctx.moe_cache_stats(),
                               tuple(ctx.layer_stats()), ctx.moe_cache_off_reason)


def _cache_lines(c: MoeCacheStats | MoeCacheMetrics | None, off_reason: str | None = None) -> list[str]:
    """The MoE cache's summary lines, the same for a local run and a server's /metrics."""
    if c is None and off_reason:
        return [f"MoE cache    OFF: asked for, but llama.cpp went on without it: {off_reason}"]
    if c is None:
        return ["MoE cache    none (--moe-cache-mib N turns it on)"]
    mode = "hybrid" if c.hybrid else "upload"
    moved = (f"the CPU computed the misses, reading {c.n_bytes_cpu / 2**20:.2f} MiB" if c.hybrid else
             f"{c.n_bytes_upload / 2**20:.2f} MiB uploaded")
    return [f"MoE cache    {mode} mode, {c.n_bytes_cache / 2**20:.2f} MiB, {c.n_slots} slots, {c.n_prefilled} prefilled by the profile",
            f"             hit rate {c.hit_rate:.3f} ({c.n_hit} hits, {c.n_hit_profile} from the profile, {c.n_miss} misses), {moved}",
            "             " + lookups_line(c.n_hit, c.n_miss, c.n_refused, c.hybrid, c.n_swap, c.n_resident, c.n_slots)]


def format_report(r: StatsReport) -> str:
    lay, c = r.layout, r.cache
    lines = [
        f"model        {r.model}",
        f"             {r.description}; {lay.n_moe_layers} MoE layers x {lay.n_expert} experts, {lay.n_expert_used} used per token",
        f"library      {r.library} ({r.variant})",
        f"experts      in RAM: {r.experts_in_ram}",
        f"prompt       {r.n_prompt} tokens at {r.prompt_tps:.1f} tok/s",
        f"generation   {r.n_gen} tokens at {r.gen_tps:.1f} tok/s",
    ]
    lines += _cache_lines(c, r.cache_off_reason)
    header = "layer  experts  used/token  bytes/expert  expert type"
    lines += ["", header + ("  slots   hits  misses  refused  hit rate" if c is not None else "")]
    per_layer = {l.il: l for l in r.cache_layers}
    for layer in lay.layers:
        line = f"{layer.il:5d}  {layer.n_expert:7d}  {lay.n_expert_used:10d}  {layer.bytes_per_expert:12,d}  {layer.type_name:11s}"
        cached = per_layer.get(layer.il)
        if cached is not None:
            line += (f"  {cached.n_slots:5d}  {cached.n_hit:5d}  {cached.n_miss:6d}  {cached.n_refused:7d}"
                     f"  {cached.hit_rate:8.3f}")
        lines.append(line)
    lines += ["", f"text: {r.text!r}"]
    return "\n".join(lines)


def format_server_report(server: str, m: ServerMetrics) -> str:
    """The local report's lines that a running llama-server's /metrics can fill."""
    c = m.moe_cache
    lines = [f"server       {server} ({m.requests_processing} requests processing)",
             f"prompt       {m.prompt_tokens} tokens at {m.prompt_tps:.1f} tok/s",
             f"generation   {m.tokens_predicted} tokens at {m.gen_tps:.1f} tok/s"]
    lines += _cache_lines(c)
    if c is not None:
        lines.append(f"             {c.n_copy} experts copied from the cache by large batches, {c.n_swap} swapped in")
        lines += ["", "layer   hits  from profile  misses  refused  hit rate"]
        for il, (hits, prof, miss) in c.layers.items():
            refused = c.layers_refused.get(il, 0)
            looked = hits + miss + refused
            rate = hits / looked if looked else 0.0
            lines.append(f"{il:5d}  {hits:5d}  {prof:12d}  {miss:6d}  {refused:7d}  {rate:8.3f}")
    return "\n".join(lines)


def run_server(args: argparse.Namespace) -> int:
    metrics = fetch_server_metrics(args.server, api_key=args.api_key or os.environ.get("LLAMA_API_KEY"))
    if args.json:
        json.dump({"server": args.server, **dataclasses.asdict(metrics)}, sys.stdout, indent=2)
        print()
    else:
        print(format_server_report(args.server, metrics))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("stats", help="run a prompt and a generation and report what happened (the main job)")
    p.add_argument("model", nargs="?", help="a GGUF MoE model (default: the embedded tiny synthetic model, made on first use)")
    p.add_argument("-p", "--prompt", help="prompt text (default: a passage of the embedded corpus)")
    p.add_argument("-n", "--n-gen", type=int, default=64, help="tokens to generate (default 64)")
    p.add_argument("-t", "--threads", type=int, help="CPU threads (default: one per core)")
    p.add_argument("-c", "--ctx", type=int, default=2048, help="context size (default 2048)")
    p.add_argument("-ngl", "--n-gpu-layers", type=int, default=-1, help="layers on the GPU (default: all)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--n-cpu-moe", type=int, help="keep the experts of the first N layers in RAM")
    where.add_argument("--no-cpu-moe", action="store_true", help="do not keep experts in RAM")
    p.add_argument("--moe-cache-mib", type=float, default=0, help="a MoE expert cache of this many MiB (default 0: none)")
    p.add_argument("--moe-cache-profile", help="fill the cache from this STRP profile")
    p.add_argument("--moe-cache-hybrid", action="store_true", help="the CPU computes the experts the cache lacks (no uploads)")
    p.add_argument("--moe-cache-adaptive", action="store_true",
                   help="with --moe-cache-hybrid: swap the experts the router picks most into the cache while generating")
    p.add_argument("--no-repack", action="store_true", help="keep CPU weights in their file layout (the cache needs it on a CPU-only build)")
    p.add_argument("--temp", type=float, default=0.8,
                   help="sampling temperature (default 0.8, seeded; 0 is greedy, which loops on the synthetic models)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--server", metavar="URL", help="report a running llama-server's cache from its /metrics "
                                                   "(started with --metrics) instead of running the model here")
    p.add_argument("--api-key", help="with --server: the server's --api-key (default: $LLAMA_API_KEY)")
    p.set_defaults(func=run)


def check_cache_options(mib: float, profile: str | None, hybrid: bool, adaptive: bool) -> None:
    """The --moe-cache-* options of a command line, refused with their own names when they contradict each other
    (llama-server only warns and goes on without the cache)."""
    if not mib >= 0 or mib > 1 << 24:  # also NaN
        raise ParameterError(f"--moe-cache-mib must be from 0 to {1 << 24} (MiB), got {mib:g}")
    if mib == 0:
        given = [f for f, v in (("--moe-cache-profile", profile), ("--moe-cache-hybrid", hybrid),
                                ("--moe-cache-adaptive", adaptive)) if v]
        if given:
            raise ParameterError(f"{', '.join(given)} need{'s' if len(given) == 1 else ''} a cache: give --moe-cache-mib N")
    if adaptive and not hybrid:
        raise ParameterError("--moe-cache-adaptive works with --moe-cache-hybrid only (the upload cache is an LRU, "
                             "which already follows the text)")
    if profile is not None and not Path(profile).is_file():
        raise ParameterError(f"--moe-cache-profile {profile}: no such file")


def run(args: argparse.Namespace) -> int:
    if args.server:
        if args.model:
            raise ServerError("stats takes a MODEL or --server URL, not both")
        return run_server(args)
    check_cache_options(args.moe_cache_mib, args.moe_cache_profile, args.moe_cache_hybrid, args.moe_cache_adaptive)
    for flag, value, low in (("-n/--n-gen", args.n_gen, 1), ("-c/--ctx", args.ctx, 0), ("--n-cpu-moe", args.n_cpu_moe, 0)):
        if value is not None and value < low:
            raise ParameterError(f"{flag} must be >= {low}, got {value}")
    model_path = Path(args.model) if args.model else default_model_path()
    mp = ModelParams(n_gpu_layers=args.n_gpu_layers,
                     cpu_moe=not args.no_cpu_moe and args.n_cpu_moe is None,
                     n_cpu_moe=args.n_cpu_moe or 0, repack=not args.no_repack,
                     use_mmap=False)  # experts in RAM are read faster from a (pinned, on a GPU build) copy than from mmap
    cp = ContextParams(n_ctx=args.ctx, n_threads=args.threads, moe_cache_mib=args.moe_cache_mib,
                       moe_cache_profile=args.moe_cache_profile, moe_cache_hybrid=args.moe_cache_hybrid,
                       moe_cache_adaptive=args.moe_cache_adaptive)
    report = run_stats(model_path, mp, cp, args.prompt or default_prompt(), args.n_gen,
                       Sampling(temperature=args.temp, seed=args.seed))
    if args.json:
        json.dump(dataclasses.asdict(report), sys.stdout, indent=2)
        print()
    else:
        print(format_report(report))
    return 0
