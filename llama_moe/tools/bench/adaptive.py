"""How much of a good profile the adaptive hybrid cache earns back
when the profile it starts from was made on other text, side by side in one run on realistic routing
(``python -m llama_moe bench-adaptive MODEL``).

The synthetic models route by topic over the embedded corpus (eight topics, ``synth/corpus.py``). The benchmark
decodes the held-out (test) paragraphs of some topics (default: the first four) and compares five hybrid
configurations of one cache size:

- ``empty+adaptive``: no profile, the adaptive cache fills itself;
- ``wrong``, ``wrong+adaptive``: a profile traced from the train paragraphs of *other* topics (default: the last
  four), static and adaptive;
- ``right``, ``right+adaptive``: a profile traced from the train paragraphs of the topics decoded, static and
  adaptive.

Each configuration gets a fresh context over one loaded model (experts in pinned RAM, as ``bench``) and then:

1. *feed*: the held-out paragraphs, teacher-forced one token per decode (as generation meets the cache), each
   paragraph its own sequence (the KV cache is cleared between paragraphs, the expert cache is not). The hit
   rate and tokens per second are measured after a warm-up of ``warmup`` tokens, over the rest (or ``measure``
   tokens), and per window of ``window`` tokens;
2. *generate*: ``runs`` times, a held-out paragraph as the prompt, then ``n_gen`` sampled tokens: the decode
   rate (median and spread over the runs) and the hit rate of those tokens. This follows the feed, so an
   adaptive cache generates with what it learnt, as in a conversation that goes on.

The recovery is (wrong+adaptive - wrong) / (right - wrong), on the feed's hit rate, on its tokens per second and
on the generation's decode rate.
"""
from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from ...context import Context, Sampling
from ..experts import ExpertLayout, expert_layout
from ...model import Model
from ...params import ContextParams, ModelParams
from ..synth.corpus import TOPICS, CorpusSplit, split_paragraphs
from ..errors import ToolInputError

CONFIGS = ("empty+adaptive", "wrong", "wrong+adaptive", "right", "right+adaptive")
ORDERS = ("interleaved", "topic")
TRACE_UBATCH = 512  # routing does not depend on batching; the profile counts it per token


@dataclass(frozen=True)
class AdaptiveRow:
    config: str                # one of CONFIGS
    profile: str               # "none", "wrong" or "right"
    adaptive: bool
    hit_rate: float | None     # feed, after the warm-up
    fed_tps: float             # feed, tokens per second after the warm-up (one token per decode)
    decode_tps: float          # generation, median over runs
    decode_tps_spread: float   # max - min over runs
    gen_hit_rate: float | None  # generation, all runs
    hit_rate_all: float | None  # feed, from its first token (warm-up included)
    n_swap: int                # experts swapped or filled in, over the whole configuration (feed and generation)
    n_swap_measured: int       # of them, during the feed's measured part
    n_prefilled: int           # experts the profile put in the cache at load
    n_slots: int               # slots in all layers
    window_hit_rates: tuple[float | None, ...] = ()  # feed, per window of ``window`` tokens from the first
    window_tps: tuple[float, ...] = ()


@dataclass(frozen=True)
class AdaptiveBench:
    model: str
    cache_mib: float
    cache_pct: float           # slots per layer / experts per layer
    slots_per_layer: int
    threads: int
    topics: tuple[str, ...]        # decoded (held-out paragraphs) and the right profile's (train paragraphs)
    other_topics: tuple[str, ...]  # the wrong profile's (train paragraphs)
    order: str
    n_fed: int                 # tokens fed per configuration
    warmup: int
    n_measured: int
    window: int
    n_gen: int
    runs: int
    profile_tokens: dict[str, int] = field(default_factory=dict)  # "right"/"wrong" -> train tokens traced
    rows: tuple[AdaptiveRow, ...] = ()
    recovery_hit: float | None = None
    recovery_fed_tps: float | None = None
    recovery_decode_tps: float | None = None

    def row(self, config: str) -> AdaptiveRow:
        return next(r for r in self.rows if r.config == config)


def recovery(wrong: float | None, adapted: float | None, right: float | None) -> float | None:
    """The share of the gap between ``wrong`` and ``right`` that ``adapted`` closes (None without a gap)."""
    if wrong is None or adapted is None or right is None or right - wrong <= 1e-12:
        return None
    return (adapted - wrong) / (right - wrong)


def _check_topics(topics: Sequence[str], other: Sequence[str]) -> None:
    for t in (*topics, *other):
        if t not in TOPICS:
            raise ToolInputError(f"unknown topic {t!r}; the corpus has {', '.join(TOPICS)}")
    if not topics or not other:
        raise ToolInputError("need at least one topic to decode and one other topic")
    if set(topics) & set(other):
        raise ToolInputError(f"the decoded topics and the other topics share {', '.join(sorted(set(topics) & set(other)))}")


def held_out_paragraphs(split: CorpusSplit, topics: Sequence[str], order: str) -> list[str]:
    """The test paragraphs of ``topics``: ``interleaved`` takes one of each topic in turn (mixed traffic, the mix
    the right profile was made for); ``topic`` takes each topic's paragraphs together (one subject at a time)."""
    if order == "topic":
        return [p for t in topics for p in split.test[t]]
    if order != "interleaved":
        raise ToolInputError(f"unknown order {order!r}; choose from {', '.join(ORDERS)}")
    out, i = [], 0
    while any(i < len(split.test[t]) for t in topics):
        out += [split.test[t][i] for t in topics if i < len(split.test[t])]
        i += 1
    return out


def trace_profile(model: Model, paragraphs: Sequence[str], layout: ExpertLayout, out: Path, threads: int) -> int:
    """Traces ``paragraphs`` (each its own sequence) on the open model and writes their profile, ranked per
    token; returns the tokens traced."""
    from ...formats.profile import write_profile
    from ..routing.ranking import make_profile
    from ..routing.routes import routes_from_records

    seqs = [model.tokenize(p) for p in paragraphs]
    longest = max(len(s) for s in seqs)
    cp = ContextParams(n_ctx=max(256, longest), n_batch=TRACE_UBATCH, n_ubatch=TRACE_UBATCH, n_threads=threads)
    records = []
    with Context(model, cp) as ctx:
        for s in seqs:
            ctx.reset()
            ctx.start_trace()
            ctx.decode(s, all_logits=True)  # every token's logits: else the last layer routes only the last token
            records += ctx.stop_trace()
    write_profile(out, make_profile(routes_from_records(records).per_token(), layout))
    return sum(len(s) for s in seqs)


def cache_mib_for_pct(layout: ExpertLayout, pct: float) -> tuple[float, int]:
    """The hybrid cache size (MiB) that gives every layer round(pct% of its experts) slots, and that number."""
    from ..routing.budget import cache_bytes_for_slots

    slots = min(max(1, round(layout.n_expert * pct / 100)), layout.n_expert)
    half_a_slot = sum(l.bytes_per_expert for l in layout.layers) // 2  # slack for the MiB -> bytes rounding
    return (cache_bytes_for_slots(layout, slots, True) + half_a_slot) / 2**20, slots


def _rate(hits: int, misses: int) -> float | None:
    return hits / (hits + misses) if hits + misses else None


def _measure(model: Model, cp: ContextParams, stream: list[list[int]], warmup: int, n_measured: int, window: int,
             prompts: list[list[int]], n_gen: int, runs: int, seed: int) -> dict:
    with Context(model, cp) as ctx:
        s0 = ctx.moe_cache_stats()
        if s0 is None:
            raise ToolInputError("the context has no MoE cache: without a GPU, moe_cache_device=\"CPU\" (--cache-device CPU) "
                                  "runs it in RAM")
        # 1. feed: held-out text, one token per decode, each paragraph its own sequence
        n_total = warmup + n_measured
        marks = sorted({0, warmup, n_total, *range(0, n_total + 1, window)})
        snaps: dict[int, tuple[float, object]] = {}
        done = 0
        for seq in stream:
            ctx.reset()
            for tok in seq:
                if done in marks:
                    snaps[done] = (time.perf_counter(), ctx.moe_cache_stats())
                if done == n_total:
                    break
                ctx.decode([tok])
                done += 1
            if done == n_total:
                break
        snaps[done] = (time.perf_counter(), ctx.moe_cache_stats())

        def between(a: int, b: int) -> tuple[float | None, float, int]:
            (ta, sa), (tb, sb) = snaps[a], snaps[b]
            return (_rate(sb.n_hit - sa.n_hit, sb.n_miss - sa.n_miss), (b - a) / (tb - ta) if tb > ta else 0.0,
                    sb.n_swap - sa.n_swap)

        hit, fed_tps, swaps_measured = between(warmup, n_total)
        hit_all = between(0, n_total)[0]
        edges = [m for m in marks if m % window == 0 or m == n_total]
        windows = [between(a, b) for a, b in zip(edges, edges[1:])]
        # 2. generate: a held-out paragraph as the prompt, then sampled tokens
        rates, gh, gm = [], 0, 0
        for run in range(runs):
            ctx.reset()
            ctx.decode(prompts[run % len(prompts)])
            before = ctx.moe_cache_stats()
            t0 = time.perf_counter()
            n = 0
            for _ in ctx.generate([], max_tokens=n_gen, sampling=Sampling(temperature=0.7, seed=seed + run),
                                  stop_at_eog=False):
                n += 1
            rates.append(n / (time.perf_counter() - t0))
            after = ctx.moe_cache_stats()
            gh, gm = gh + after.n_hit - before.n_hit, gm + after.n_miss - before.n_miss
        end = ctx.moe_cache_stats()
    return dict(hit_rate=hit, fed_tps=fed_tps, decode_tps=statistics.median(rates) if rates else 0.0,
                decode_tps_spread=max(rates) - min(rates) if rates else 0.0, gen_hit_rate=_rate(gh, gm),
                hit_rate_all=hit_all, n_swap=end.n_swap - s0.n_swap, n_swap_measured=swaps_measured,
                n_prefilled=end.n_prefilled, n_slots=end.n_slots,
                window_hit_rates=tuple(w[0] for w in windows), window_tps=tuple(w[1] for w in windows))


def run_bench_adaptive(model_path: str | Path, cache_pct: float = 50, threads: int = 8, n_gen: int = 128,
                       runs: int = 3, warmup: int = 256, measure: int = 0, window: int = 128,
                       topics: Sequence[str] = TOPICS[:4], other_topics: Sequence[str] = TOPICS[4:],
                       order: str = "interleaved", seed: int = 0, configs: Sequence[str] = CONFIGS,
                       profile_dir: str | Path | None = None,
                       log: Callable[[str], None] = print, cache_device: str | None = None) -> AdaptiveBench:
    """Runs ``configs`` (default: all five) side by side; see the module's docstring. ``measure`` 0 measures
    every held-out token after the warm-up; ``cache_device`` names the cache's device (moe_cache_device: "CPU"
    runs it in RAM; None: the GPU)."""
    _check_topics(topics, other_topics)
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        raise ToolInputError(f"unknown configurations {', '.join(sorted(unknown))}; choose from {', '.join(CONFIGS)}")
    if warmup < 0 or measure < 0 or window < 1 or runs < 0 or n_gen < 0:
        raise ToolInputError("warmup, measure, runs and n_gen must be >= 0 and window >= 1")
    if not 0 < cache_pct <= 100:
        raise ToolInputError(f"--cache-pct must be above 0 and at most 100, got {cache_pct:g}")
    if threads < 1:
        raise ToolInputError(f"-t/--threads must be >= 1, got {threads}")
    model_path = Path(model_path)
    layout = expert_layout(model_path)
    if not layout.layers:
        raise ToolInputError(f"{model_path}: no MoE expert tensors")
    cache_mib, slots = cache_mib_for_pct(layout, cache_pct)
    split = split_paragraphs()
    profile_dir = Path(profile_dir) if profile_dir else Path(tempfile.mkdtemp(prefix="bench-adaptive-"))
    profile_dir.mkdir(parents=True, exist_ok=True)
    rows: list[AdaptiveRow] = []
    profile_tokens: dict[str, int] = {}
    # experts in pinned host memory (no mmap), as bench: the CPU's share and the swaps run at full speed
    with Model(model_path, ModelParams(cpu_moe=True, use_mmap=False, repack=False)) as model:
        paths = {}
        for name, ts in (("right", topics), ("wrong", other_topics)):
            if not any(c.startswith(name) for c in configs):
                continue
            t0 = time.perf_counter()
            paths[name] = profile_dir / f"{name}.strp"
            profile_tokens[name] = trace_profile(model, [p for t in ts for p in split.train[t]], layout, paths[name],
                                                 threads)
            log(f"profile '{name}': {profile_tokens[name]} train tokens of {', '.join(ts)} traced in "
                f"{time.perf_counter() - t0:.1f} s -> {paths[name]}")
        held_out = held_out_paragraphs(split, topics, order)
        stream = [model.tokenize(p) for p in held_out]
        n_stream = sum(len(s) for s in stream)
        if warmup >= n_stream:
            raise ToolInputError(f"the warm-up of {warmup} tokens leaves nothing of the {n_stream} held-out tokens")
        n_measured = n_stream - warmup if measure == 0 else min(measure, n_stream - warmup)
        if measure and measure > n_measured:
            log(f"only {n_stream} held-out tokens: measuring {n_measured} after the warm-up, not {measure}")
        mixed = held_out_paragraphs(split, topics, "interleaved")  # each run's prompt from the next topic
        prompts = [model.tokenize(mixed[i % len(mixed)]) for i in range(max(runs, 1))]
        n_ctx = max(256, max(len(s) for s in stream) + 8, max(len(p) for p in prompts) + n_gen + 8)
        log(f"cache: {slots} of {layout.n_expert} experts per layer ({cache_mib:.0f} MiB); feeding {warmup} + "
            f"{n_measured} held-out tokens of {', '.join(topics)} ({order}), then {runs} x {n_gen} generated")
        for config in (c for c in CONFIGS if c in configs):
            profile = "none" if config.startswith("empty") else config.split("+")[0]
            adaptive = config.endswith("+adaptive")
            cp = ContextParams(n_ctx=n_ctx, n_batch=512, n_ubatch=512, n_threads=threads, moe_cache_mib=cache_mib,
                               moe_cache_hybrid=True, moe_cache_adaptive=adaptive,
                               moe_cache_profile=paths.get(profile), moe_cache_device=cache_device)
            t0 = time.perf_counter()
            m = _measure(model, cp, stream, warmup, n_measured, window, prompts, n_gen, runs, seed)
            row = AdaptiveRow(config, profile, adaptive, **m)
            rows.append(row)
            log(f"{config:>15}: hits {_f(row.hit_rate)} (from the start {_f(row.hit_rate_all)}), fed "
                f"{row.fed_tps:.2f} tok/s, decode {row.decode_tps:.2f} tok/s (spread {row.decode_tps_spread:.2f}), "
                f"generation hits {_f(row.gen_hit_rate)}, swaps {row.n_swap} ({time.perf_counter() - t0:.1f} s)")
    by = {r.config: r for r in rows}

    def rec(attr: str) -> float | None:
        if not {"wrong", "wrong+adaptive", "right"} <= by.keys():
            return None
        return recovery(getattr(by["wrong"], attr), getattr(by["wrong+adaptive"], attr), getattr(by["right"], attr))

    return AdaptiveBench(str(model_path), cache_mib, 100 * slots / layout.n_expert, slots, threads, tuple(topics),
                         tuple(other_topics), order, warmup + n_measured, warmup, n_measured, window, n_gen, runs,
                         profile_tokens, tuple(rows), rec("hit_rate"), rec("fed_tps"), rec("decode_tps"))


def _f(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def to_markdown(b: AdaptiveBench) -> str:
    out = ["| configuration | hit rate (feed) | feed tok/s | decode tok/s (spread) | hit rate (generation) | "
           "swaps | prefilled |",
           "|---|---:|---:|---:|---:|---:|---:|"]
    for r in b.rows:
        out.append(f"| {r.config} | {_f(r.hit_rate)} | {r.fed_tps:.2f} | {r.decode_tps:.2f} ({r.decode_tps_spread:.2f}) | "
                   f"{_f(r.gen_hit_rate)} | {r.n_swap} | {r.n_prefilled} |")
    out += ["", f"Recovery by the adaptive cache of the gap between the other-text and the right-text profile: "
                f"hit rate {_pct(b.recovery_hit)}, feed tok/s {_pct(b.recovery_fed_tps)}, decode tok/s "
                f"{_pct(b.recovery_decode_tps)}."]
    n_windows = max((len(r.window_hit_rates) for r in b.rows), default=0)
    if n_windows:
        edges = [min((i + 1) * b.window, b.n_fed) for i in range(n_windows)]
        out += ["", "Feed hit rate per window (tokens fed so far, the warm-up included):", "",
                "| configuration | " + " | ".join(f"..{e}" for e in edges) + " |",
                "|---|" + "---:|" * n_windows]
        for r in b.rows:
            out.append(f"| {r.config} | " + " | ".join(_f(h) for h in r.window_hit_rates) + " |")
    return "\n".join(out)


def summary(b: AdaptiveBench) -> str:
    return (f"{Path(b.model).name}: hybrid cache of {b.slots_per_layer} slots per layer ({b.cache_pct:.0f}% of the "
            f"experts, {b.cache_mib:.0f} MiB), {b.threads} threads; decoded: held-out paragraphs of "
            f"{', '.join(b.topics)} ({b.order}), {b.warmup} warm-up + {b.n_measured} measured tokens fed one per "
            f"decode, then {b.runs} x {b.n_gen} generated tokens; right profile: train paragraphs of the same topics "
            f"({b.profile_tokens.get('right', 0)} tokens), wrong profile: train paragraphs of "
            f"{', '.join(b.other_topics)} ({b.profile_tokens.get('wrong', 0)} tokens).")
