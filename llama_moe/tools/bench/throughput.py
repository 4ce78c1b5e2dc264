"""Decode and prompt throughput of each way to run a MoE model whose experts live in RAM, side by side on the
same model and the same real text (``python -m llama_moe bench``): experts in RAM, llama.cpp's split, the
upload and hybrid caches, all in VRAM; each row with the bound its bytes from RAM (or over PCIe) set."""
from __future__ import annotations

import dataclasses
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ...context import Context, Sampling
from ...devices import gpus
from ...errors import ParameterError
from ..experts import expert_layout
from ...model import Model
from ...params import ContextParams, ModelParams
from .bandwidth import gpu_copy_gbps, ram_read_gbps
from .corpus_profile import train_profile

@dataclass(frozen=True)
class BenchRow:
    mode: str
    cache_mib: float
    cache_pct: float
    threads: int
    decode_tps: float          # median over runs
    decode_tps_spread: float   # max - min over runs
    pp_tps: float
    pp_tps_spread: float
    hit_rate: float | None     # during decode
    vram_mib: float | None     # device memory the model and context took
    runs: int
    ram_mb_per_token: float | None = None  # expert bytes the CPU read from RAM per generated token
    bound_tps: float | None = None         # the decode rate if reading those bytes were the only cost
    of_bound: float | None = None          # decode_tps / bound_tps
    bound_by: str | None = None            # "RAM" (the CPU reads the bytes), "H2D" (upload mode copies them over PCIe) or "GPU" (all in VRAM is slower still)
    cache_off: bool = False                # a cache mode whose context had no cache (no GPU): it measured cpu-moe


def _prompt_tokens(model: Model, n: int, offset_paragraphs: int) -> list[int]:
    """n tokens of the corpus's held-out paragraphs, starting offset_paragraphs in: text no profile of the
    benchmark was made from (train_profile traces the train paragraphs), so that hit rates are not in-sample."""
    from ..synth.corpus import split_paragraphs

    paragraphs = split_paragraphs().test_paragraphs()
    k = offset_paragraphs % len(paragraphs)
    tokens = model.tokenize("\n\n".join(paragraphs[k:] + paragraphs[:k]))
    while len(tokens) < n:
        tokens += tokens
    return tokens[:n]


def _free_mib() -> float | None:
    g = gpus()
    return g[0].mib_free if g else None


def _base_free(seen: float | None) -> float | None:
    """The GPU's free memory before a model loads: the most seen so far, so that memory another process was
    still giving back when the benchmark started (a run killed just before) does not make "VRAM used" negative."""
    now = _free_mib()
    return now if seen is None or now is None else max(seen, now)


def _used_mib(before: float | None) -> float | None:
    now = _free_mib()
    if now is None or before is None:
        return None
    return before - now


@dataclass(frozen=True)
class ContextRates:
    """One context's measured rates (measure_context): decode and prompt tok/s per counted run, the decode's hit
    rate, the VRAM used with the context alive (MiB; None where unknown), the bytes per generated token that come
    from RAM (those the CPU computes in the hybrid, those uploaded in upload mode), and whether the context had a
    MoE cache (the engine's answer: without a GPU it turns one off)."""
    decode: list[float]
    pp: list[float]
    hit_rate: float | None
    used_mib: float | None
    ram_bytes_per_token: float | None
    has_cache: bool


def measure_context(model: Model, cp: ContextParams, n_gen: int, n_pp: int, runs: int, seed: int,
                    base_free: float | None = None) -> ContextRates:
    """The bench's measurement of one context: runs + 1 rounds of a prompt of n_pp tokens and n_gen generated
    tokens after a held-out paragraph, the first round not counted (it warms caches and allocators)."""
    decode, pp, hit, cpu_bytes = [], [], None, None
    with Context(model, cp) as ctx:
        has_cache = ctx.moe_cache_stats() is not None
        used = _used_mib(base_free)  # with the context and its cache alive
        pp_tokens = _prompt_tokens(model, n_pp, 0)
        for run in range(runs + 1):  # the first run warms caches and allocators and is not counted
            # each run generates after another held-out paragraph: a cache warmed by one run meets new text
            prompt = _prompt_tokens(model, 64, 5 + 7 * run)
            ctx.reset()
            t0 = time.perf_counter()
            ctx.decode(pp_tokens)
            ctx.logits()
            t_pp = time.perf_counter() - t0
            ctx.reset()
            ctx.decode(prompt[:-1])
            before = ctx.moe_cache_stats()
            t0 = time.perf_counter()
            n = 0
            for _ in ctx.generate(prompt[-1:], max_tokens=n_gen, sampling=Sampling(temperature=0.7, seed=seed + run),
                                  stop_at_eog=False):
                n += 1
            t_gen = time.perf_counter() - t0
            after = ctx.moe_cache_stats()
            if run == 0:
                continue
            pp.append(n_pp / t_pp)
            decode.append(n / t_gen)
            if before is not None and after is not None:
                lookups = after.n_lookup - before.n_lookup  # refused lookups included
                hit = (after.n_hit - before.n_hit) / lookups if lookups else None
                moved = after.n_bytes_cpu - before.n_bytes_cpu if after.hybrid else after.n_bytes_upload - before.n_bytes_upload
                cpu_bytes = moved / max(n, 1)
    return ContextRates(decode, pp, hit, used, cpu_bytes, has_cache)


MODES = ("cpu-moe", "n-cpu-moe", "upload", "hybrid", "hybrid-no-mailbox", "hybrid-adaptive", "hybrid-admit", "vram")
CACHE_MODES = ("upload", "hybrid", "hybrid-no-mailbox", "hybrid-adaptive", "hybrid-admit")
ADMIT = 1  # hybrid-admit: missed experts admitted per layer and decode (the best of 1, 2, 4, 8 held out,
           # benchmarks/admit_policies.py)
REPARTITION = 0  # hybrid-admit: decodes between moves of slots between layers (0: never)


def run_bench(model_path: Path, cache_pcts: list[float], threads: list[int], n_gen: int, n_pp: int, runs: int,
              vram: bool, seed: int = 0, log=print, modes: tuple[str, ...] = ("cpu-moe", "upload", "vram"),
              profile: Path | None = None, cache_device: str | None = None) -> list[BenchRow]:
    """The rows of every mode, cache size and thread count; ``cache_device`` names the device that holds the
    cache (moe_cache_device: "CPU" runs it in RAM; None: the GPU)."""
    layout = expert_layout(model_path)
    total_mib = layout.total_expert_bytes / 2**20
    rows: list[BenchRow] = []
    g = gpus()
    base_free = _base_free(None)

    # what a generated token reads when every expert is computed from RAM (k per MoE layer)
    all_experts_per_token = sum(l.bytes_per_expert for l in layout.layers) * layout.n_expert_used
    ram_gbps = {t: ram_read_gbps(t) for t in threads}
    for t, gbps in ram_gbps.items():
        log(f"RAM read bandwidth with {t} threads: {gbps:.1f} GB/s")
    copy = gpu_copy_gbps()
    for c in copy:
        log(f"{c.device}: host to device {c.h2d_pinned_gbps:.1f} GB/s pinned, {c.h2d_pageable_gbps:.1f} GB/s pageable; "
            f"device copies {c.d2d_gbps:.0f} GB/s")
    # upload mode's misses cross PCIe from the pinned experts: its bound is that link, not the CPU's reads
    h2d_gbps = copy[0].h2d_pinned_gbps if copy and copy[0].h2d_pinned_gbps > 0 else None

    def row(mode: str, mib: float, t: int, m: ContextRates, ram_bytes: float | None = None,
            link_gbps: float | None = None, cache_off: bool = False) -> None:
        d, p, hit, used = m.decode, m.pp, m.hit_rate, m.used_mib  # no hit rate without a cache
        gbps = link_gbps if link_gbps else ram_gbps[t]
        bound = gbps * 1e9 / ram_bytes if ram_bytes else None
        median = statistics.median(d)
        r = BenchRow(mode, mib, 100 * mib / total_mib if total_mib else 0.0, t, median, max(d) - min(d),
                     statistics.median(p), max(p) - min(p), hit, used, len(d),
                     None if ram_bytes is None else ram_bytes / 1e6, bound, median / bound if bound else None,
                     None if bound is None else ("H2D" if link_gbps else "RAM"), cache_off)
        rows.append(r)
        log(f"{mode:>14}{' (cache off)' if cache_off else ''} cache {mib:9.0f} MiB ({r.cache_pct:3.0f}%) t={t:2d}: decode {r.decode_tps:8.2f} tok/s, "
            f"pp{n_pp} {r.pp_tps:9.1f} tok/s, hits {'-' if hit is None else f'{hit:.3f}'}, "
            f"VRAM {'-' if used is None else f'{used:.0f} MiB'}")

    # experts in pinned host memory (no mmap): uploads and llama.cpp's own prompt copies run at full PCIe speed
    base_free = _base_free(base_free)
    with Model(model_path, ModelParams(cpu_moe=True, use_mmap=False, repack=False)) as model:
        for t in threads:
            n_ctx = max(1024, n_pp + n_gen + 128)
            if "cpu-moe" in modes:
                cp = ContextParams(n_ctx=n_ctx, n_batch=n_pp, n_ubatch=n_pp, n_threads=t)
                m = measure_context(model, cp, n_gen, n_pp, runs, seed, base_free)
                row("cpu-moe", 0.0, t, m, all_experts_per_token)
            for pct in cache_pcts:
                mib = total_mib * pct / 100
                for mode in CACHE_MODES:
                    if mode not in modes:
                        continue
                    hybrid = mode != "upload"
                    cp = ContextParams(n_ctx=n_ctx, n_batch=n_pp, n_ubatch=n_pp, n_threads=t, moe_cache_mib=mib,
                                       moe_cache_hybrid=hybrid, moe_cache_adaptive=mode == "hybrid-adaptive",
                                       moe_cache_admit=ADMIT if mode == "hybrid-admit" else 0,
                                       moe_cache_repartition=REPARTITION if mode == "hybrid-admit" else 0,
                                       moe_cache_profile=profile if hybrid else None, moe_cache_device=cache_device,
                                       # hybrid-no-mailbox: the hand-overs through llama.cpp's scheduler (the mailbox's before)
                                       moe_cache_mailbox=False if mode == "hybrid-no-mailbox" else None)
                    m = measure_context(model, cp, n_gen, n_pp, runs, seed, base_free)
                    if not m.has_cache:
                        # what ran was cpu-moe under this mode's name: marked, never a cache's number
                        log(f"{mode}: the context has no MoE cache (no GPU; --cache-device CPU runs it in RAM): "
                            f"the row is marked 'cache off'")
                        row(mode, mib, t, m, all_experts_per_token, cache_off=True)
                    elif hybrid:
                        row(mode, mib, t, m, m.ram_bytes_per_token)
                    else:  # misses cross PCIe: bounded by the link, measurable only with a GPU
                        row(mode, mib, t, m, m.ram_bytes_per_token if h2d_gbps else None, h2d_gbps)
    if "n-cpu-moe" in modes:
        # llama.cpp's own answer to the same VRAM: whole layers' experts on the GPU, the first N in RAM
        per_layer = layout.total_expert_bytes / max(layout.n_moe_layers, 1) / 2**20
        for pct in cache_pcts:
            mib = total_mib * pct / 100
            n_cpu_moe = layout.n_moe_layers - int(mib // per_layer)
            base_free = _base_free(base_free)
            with Model(model_path, ModelParams(n_cpu_moe=n_cpu_moe, use_mmap=False, repack=False)) as split:
                for t in threads:
                    cp = ContextParams(n_ctx=max(1024, n_pp + n_gen + 128), n_batch=n_pp, n_ubatch=n_pp, n_threads=t)
                    m = measure_context(split, cp, n_gen, n_pp, runs, seed, base_free)
                    row(f"n-cpu-moe {n_cpu_moe}", (layout.n_moe_layers - n_cpu_moe) * per_layer, t, m,
                        all_experts_per_token * n_cpu_moe / max(layout.n_moe_layers, 1))
    if vram and "vram" in modes:
        base_free = _base_free(base_free)
        with Model(model_path, ModelParams()) as model:
            cp = ContextParams(n_ctx=max(1024, n_pp + n_gen + 128), n_batch=n_pp, n_ubatch=n_pp, n_threads=threads[0])
            m = measure_context(model, cp, n_gen, n_pp, runs, seed, base_free)
            row("all-in-vram", total_mib, threads[0], m, 0.0)
    ceiling = next((r.decode_tps for r in rows if r.mode == "all-in-vram"), None) if g else None
    return [with_gpu_ceiling(r, ceiling) for r in rows] if ceiling else rows


def with_gpu_ceiling(row: BenchRow, vram_tps: float) -> BenchRow:
    """No mode decodes faster than with every expert in VRAM: the GPU's own time per token bounds it too, even
    if the CPU's reads overlapped it perfectly. Where that binds before RAM or PCIe, the bound says "GPU"."""
    if row.bound_tps is None or row.mode == "all-in-vram" or row.bound_tps <= vram_tps:
        return row
    return dataclasses.replace(row, bound_tps=vram_tps, of_bound=row.decode_tps / vram_tps, bound_by="GPU")


def load_rows(paths: list[Path]) -> list[BenchRow]:
    """Rows that ``bench --json`` wrote, from several runs (one machine, one model), bounded by the single
    all-in-VRAM row among them where there is one."""
    fields = {f.name for f in dataclasses.fields(BenchRow)}
    required = {f.name for f in dataclasses.fields(BenchRow) if f.default is dataclasses.MISSING}
    rows: list[BenchRow] = []
    for path in paths:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise ParameterError(f"--merge {path}: not a JSON file that bench --json wrote ({e})") from e
        if not isinstance(data, list) or not all(isinstance(d, dict) for d in data):
            raise ParameterError(f"--merge {path}: expected a list of rows, as bench --json writes")
        for i, d in enumerate(data):
            missing, unknown = required - d.keys(), d.keys() - fields
            if missing or unknown:
                raise ParameterError(f"--merge {path}: row {i} " + "; ".join(
                    [f"lacks {', '.join(sorted(missing))}"] * bool(missing) + [f"has unknown {', '.join(sorted(unknown))}"] * bool(unknown)))
            rows.append(BenchRow(**d))
    vram = [r for r in rows if r.mode == "all-in-vram"]
    if len(vram) > 1:
        raise ParameterError(f"--merge: {len(vram)} all-in-VRAM rows; merge runs with one ceiling, from one machine")
    if not vram:
        return rows
    return [r if r.bound_by == "GPU" else with_gpu_ceiling(r, vram[0].decode_tps) for r in rows]


def to_markdown(rows: list[BenchRow], n_pp: int) -> str:
    out = [f"| mode | cache MiB | % of experts | threads | decode tok/s (spread) | pp{n_pp} tok/s (spread) | hit rate | VRAM MiB "
           "| MB/token from RAM | bound tok/s | of bound |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        mode = f"{r.mode} (cache off: no GPU)" if r.cache_off else r.mode
        out.append(f"| {mode} | {r.cache_mib:.0f} | {r.cache_pct:.0f} | {r.threads} | {r.decode_tps:.2f} ({r.decode_tps_spread:.2f}) | "
                   f"{r.pp_tps:.1f} ({r.pp_tps_spread:.1f}) | {'-' if r.hit_rate is None else f'{r.hit_rate:.3f}'} | "
                   f"{'-' if r.vram_mib is None else f'{r.vram_mib:.0f}'} | "
                   f"{'-' if r.ram_mb_per_token is None else f'{r.ram_mb_per_token:.2f}'} | "
                   f"{'-' if r.bound_tps is None else f'{r.bound_tps:.1f} ({r.bound_by})'} | "
                   f"{'-' if r.of_bound is None else f'{100 * r.of_bound:.0f}%'} |")
    return "\n".join(out)


def parse_modes(text: str) -> tuple[str, ...]:
    """``--modes``'s comma-separated list, each of MODES."""
    modes = tuple(m.strip() for m in text.split(",") if m.strip())
    if not modes:
        raise ParameterError(f"--modes names no mode; choose from {', '.join(MODES)}")
    unknown = set(modes) - set(MODES)
    if unknown:
        raise ParameterError(f"unknown --modes {', '.join(sorted(unknown))}; choose from {', '.join(MODES)}")
    return modes


def check_numbers(cache_pcts: list[float], threads: list[int], n_gen: int, n_pp: int, runs: int,
                  profile_stride: int) -> None:
    """Refuse what cannot run before loading anything (a model load can take a minute)."""
    bad = [f"--cache-pct must be above 0 and at most 100, got {p:g}" for p in cache_pcts if not 0 < p <= 100]
    bad += [f"-t/--threads must be >= 1, got {t}" for t in threads if t < 1]
    bad += [f"-t/--threads must be at most 1024, got {t}" for t in threads if t > 1024]
    for name, value in (("-n/--n-gen", n_gen), ("--pp", n_pp), ("--runs", runs), ("--profile-stride", profile_stride)):
        if value < 1:
            bad.append(f"{name} must be >= 1, got {value}")
    if n_pp + n_gen + 128 > 1 << 24:  # the context holds both (ContextParams.n_ctx)
        bad.append(f"--pp and -n/--n-gen must add up to at most {(1 << 24) - 128}, got {n_pp} + {n_gen}")
    if bad:
        raise ParameterError("; ".join(bad))


def bench_model(model_path: Path, cache_pcts: list[float], threads: list[int], n_gen: int, n_pp: int, runs: int,
                vram: bool, modes: tuple[str, ...], profile: Path | None = None, profile_stride: int = 1,
                log: Callable[[str], None] = print, cache_device: str | None = None) -> list[BenchRow]:
    """``run_bench`` after checking its numbers, with the hybrid modes' profile made from the corpus's train
    paragraphs (every ``profile_stride``-th) when none is given."""
    check_numbers(cache_pcts, threads, n_gen, n_pp, runs, profile_stride)
    if profile is None and set(CACHE_MODES[1:]) & set(modes):
        import tempfile

        profile = train_profile(model_path, Path(tempfile.mkdtemp()) / "train.strp", log, stride=profile_stride)
    return run_bench(model_path, cache_pcts, threads, n_gen, n_pp, runs, vram, log=log, modes=modes, profile=profile,
                     cache_device=cache_device)


def rows_json(rows: list[BenchRow]) -> str:
    """The rows as ``bench --json`` writes them (and ``load_rows`` reads them)."""
    return json.dumps([dataclasses.asdict(r) for r in rows], indent=2) + "\n"
