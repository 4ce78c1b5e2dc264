"""The main job's report (``python -m llama_moe stats``): a prompt and a generation with the experts in RAM,
and what happened: throughput, the model's MoE geometry, where its experts were and what the cache did."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

from ..context import Context, Sampling
from ..errors import MoeCacheWarning
from ..experts import ExpertLayout, expert_layout
from ..model import Model
from ..params import ContextParams, ModelParams
from ..stats import LayerStats, MoeCacheStats, cache_lines


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
    cache_not_as_asked: str | None = None  # a cache, but other than asked (fewer slots, a refused profile...): how


def run_stats(model_path: Path, model_params: ModelParams, ctx_params: ContextParams, prompt: str,
              n_gen: int, sampling: Sampling) -> StatsReport:
    from .._native import loader as _loader

    layout = expert_layout(model_path)
    with Model(model_path, model_params) as model:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MoeCacheWarning)  # the report says it (cache_off_reason, cache_not_as_asked)
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
            status = ctx.cache_status()
            return StatsReport(str(model_path), model.description, str(_loader.library_path()),
                               manifest.get("variant", "?"), placement, layout, perf.n_prompt, perf.n_gen,
                               perf.prompt_tps, perf.gen_tps, completion.text, ctx.moe_cache_stats(),
                               tuple(ctx.layer_stats()), ctx.moe_cache_off_reason,
                               status.text if status.state == "partial" else None)


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
    lines += cache_lines(c, r.cache_off_reason, r.cache_not_as_asked)
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
