"""The main job's report (``python -m llama_moe stats``): a prompt and a generation with the experts in RAM,
and what happened: throughput, the model's MoE geometry, where its experts were and what the cache did; by
default the same prompt and generation twice, without the cache and with it, so the report shows what the cache
changed and that the tokens did not."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from pathlib import Path

from ...context import Context, Sampling
from ...errors import MoeCacheWarning
from ..experts import ExpertLayout, expert_layout
from ...model import Model
from ...params import ContextParams, ModelParams
from ...stats import LayerStats, MoeCacheStats, cache_lines


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
    tokens: tuple[int, ...] = ()  # the generated tokens


def run_stats(model_path: Path, model_params: ModelParams, ctx_params: ContextParams, prompt: str,
              n_gen: int, sampling: Sampling) -> StatsReport:
    """One prompt and generation with ``ctx_params``."""
    layout = expert_layout(model_path)
    with Model(model_path, model_params) as model:
        return _run_one(model, model_path, model_params, layout, ctx_params, prompt, n_gen, sampling)


def run_main_job(model_path: Path, model_params: ModelParams, ctx_params: ContextParams, prompt: str,
                 n_gen: int, sampling: Sampling) -> "Comparison":
    """The same prompt and generation without the cache, then with ``ctx_params``' cache, on one loaded model."""
    layout = expert_layout(model_path)
    with Model(model_path, model_params) as model:
        plain = _run_one(model, model_path, model_params, layout, replace(
            ctx_params, moe_cache_mib=0, moe_cache_profile=None, moe_cache_hybrid=False, moe_cache_adaptive=False,
            moe_cache_admit=0, moe_cache_repartition=0, moe_cache_peer=None, moe_ram_mib=0), prompt, n_gen, sampling)
        cached = _run_one(model, model_path, model_params, layout, ctx_params, prompt, n_gen, sampling)
    return Comparison(plain, cached, _same_prefix(plain.tokens, cached.tokens))


def _same_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _run_one(model: Model, model_path: Path, model_params: ModelParams, layout: ExpertLayout,
             ctx_params: ContextParams, prompt: str, n_gen: int, sampling: Sampling) -> StatsReport:
    from ..._native import loader as _loader

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
        placement = ("every layer's, mapped from the file untouched (lazy_experts)" if model_params.lazy_experts else
                     "all layers (cpu_moe)" if model_params.cpu_moe else
                     f"layers 0..{model_params.n_cpu_moe - 1} (n_cpu_moe)" if model_params.n_cpu_moe else
                     "none (experts on the default device)")
        manifest = _loader.manifest()
        status = ctx.cache_status()
        return StatsReport(str(model_path), model.description, str(_loader.library_path()),
                           manifest.get("variant", "?"), placement, layout, perf.n_prompt, perf.n_gen,
                           perf.prompt_tps, perf.gen_tps, completion.text, ctx.moe_cache_stats(),
                           tuple(ctx.layer_stats()), ctx.moe_cache_off_reason,
                           # a cache other than asked, or settings given without a size: the engine's reasons
                           status.text if not status.as_asked and ctx.moe_cache_off_reason is None else None,
                           completion.tokens)


@dataclass(frozen=True)
class Comparison:
    """The main job's two runs: ``plain`` without the cache, ``cached`` with it; ``n_same`` generated tokens
    agree from the first on."""

    plain: StatsReport
    cached: StatsReport
    n_same: int

    @property
    def identical(self) -> bool:
        return self.n_same == len(self.plain.tokens) == len(self.cached.tokens)


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
    peer = any(l.n_slots_peer for l in r.cache_layers)  # the peer tier's columns: its slots, the misses it computed
    lines += ["", header + ("  slots   hits  misses  refused  hit rate" if c is not None else "") +
              ("  peer slots  peer hits" if peer else "")]
    per_layer = {l.il: l for l in r.cache_layers}
    for layer in lay.layers:
        line = f"{layer.il:5d}  {layer.n_expert:7d}  {lay.n_expert_used:10d}  {layer.bytes_per_expert:12,d}  {layer.type_name:11s}"
        cached = per_layer.get(layer.il)
        if cached is not None:
            line += (f"  {cached.n_slots:5d}  {cached.n_hit:5d}  {cached.n_miss:6d}  {cached.n_refused:7d}"
                     f"  {cached.hit_rate:8.3f}")
            line += f"  {cached.n_slots_peer:10d}  {cached.n_hit_peer:9d}" if peer else ""
        lines.append(line)
    lines += ["", f"text: {r.text!r}"]
    return "\n".join(lines)


def format_comparison(c: Comparison, where: str | None = None) -> str:
    """The main job's report: both runs' throughput, whether the tokens agree, and the cached run's counters
    (``where``: a line on where the cache ran, e.g. in RAM for want of a GPU)."""
    p, r = c.plain, c.cached
    lay = r.layout
    lines = [
        f"model        {r.model}",
        f"             {r.description}; {lay.n_moe_layers} MoE layers x {lay.n_expert} experts, {lay.n_expert_used} used per token",
        f"library      {r.library} ({r.variant})",
        f"experts      in RAM: {r.experts_in_ram}",
    ]
    if where:
        lines.append(f"cache        {where}")
    lines += [
        "",
        f"{'':13s}{'no cache':>22s}  {'with the cache':>22s}",
        f"{'prompt':13s}{f'{p.n_prompt} tok, {p.prompt_tps:.1f} tok/s':>22s}  {f'{r.n_prompt} tok, {r.prompt_tps:.1f} tok/s':>22s}",
        f"{'generation':13s}{f'{p.n_gen} tok, {p.gen_tps:.1f} tok/s':>22s}  {f'{r.n_gen} tok, {r.gen_tps:.1f} tok/s':>22s}",
    ]
    if c.identical:
        lines.append(f"tokens       identical: the {len(r.tokens)} generated tokens are the same with and without the cache")
    else:
        lines.append(f"tokens       DIFFERENT from generated token {c.n_same} on (of {len(r.tokens)}): the cache's device "
                     "rounds differently from the CPU" if r.cache is not None else
                     f"tokens       DIFFERENT from generated token {c.n_same} on (of {len(r.tokens)})")
    lines.append("")
    lines += cache_lines(r.cache, r.cache_off_reason, r.cache_not_as_asked)
    s = r.cache
    if s is not None and s.n_lookup:
        on_cpu = s.n_miss + s.n_refused - s.n_hit_peer
        moved = (f"the CPU computed the {on_cpu} others" if s.hybrid and not s.n_hit_peer else
                 f"the peer tier computed {s.n_hit_peer} and the CPU the {on_cpu} others" if s.hybrid else
                 f"{s.n_bytes_upload / 2**20:.2f} MiB uploaded for the misses")
        if s.ram_tier:
            lines.append(f"saved        {s.n_hit} of {s.n_lookup} expert lookups ({100.0 * s.n_hit / s.n_lookup:.1f}%) found "
                         f"their expert in the RAM tier; the {s.n_miss} others were read from the model's file")
        else:
            lines.append(f"saved        {s.n_hit} of {s.n_lookup} expert lookups ({100.0 * s.n_hit / s.n_lookup:.1f}%) ran on the "
                         f"cache's copy instead of the CPU's; {moved}")
    rest = format_report(r).split("\n")
    table = rest.index("") + 1  # the per-layer table and the text, as the single run prints them
    return "\n".join(lines + [""] + rest[table:])
