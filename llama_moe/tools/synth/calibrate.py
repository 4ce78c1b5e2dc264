"""The synthetic routing beside published measurements of real routing (numpy only).

Measured as the published figures were: every corpus paragraph is one prompt; each layer has
its own cache, emptied at every prompt (the flat 512-expert shape: each corpus document one
stream, the cache warm across it, as that trace's long-running cache was); in the LRU a token's
own experts never evict each other; hit rate = hits / selections; overlap = mean |S_t & S_t-1| / k
over adjacent tokens of a prompt; the shuffle keeps each prompt's tokens and destroys their order.
Shapes with no published trace (gpt-oss) are held to targets derived from Qwen3-30B-A3B's by a
stated rule (``derived_targets``).

Published (Qwen3-30B-A3B, 4-bit MLX build, 25 prompts, 3,225 decode tokens, cache reset per
prompt; gajsanders/moe-trace, docs/findings 004-007): per-layer LRU at 8 / 16 / 32 / 64 of 128
experts 0.424 / 0.647 / 0.810 / 0.918, the oracle (Belady) 0.608 / 0.784 / 0.888 / 0.929;
adjacent overlap 0.079 at layer 0, 0.54-0.60 in the middle layers, 0.206 at layer 47; per
prompt the hottest 16 experts take 0.55-0.62 of a layer's picks, normalised entropy 0.76-0.81.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields, replace

import numpy as np

from llama_moe.errors import LlamaMoeError
from llama_moe.tools.synth.calibration import calibration_of
from llama_moe.tools.synth.config import RoutingConfig, routing_for
from llama_moe.tools.synth.design import build_design
from llama_moe.tools.synth.corpus import load_corpus, paragraphs
from llama_moe.tools.synth.hitrate import (adjacent_overlap, belady_per_prompt, expert_counts, lru_per_prompt,
                                           prompt_concentration, shuffled)
from llama_moe.tools.synth.routing import corpus_routes
from llama_moe.tools.synth.shapes import SHAPES, Shape, get_shape

FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2)  # 8 / 16 / 32 / 64 of 128 experts
PUBLISHED_SLOTS = (8, 16, 32, 64)  # of Qwen3-30B-A3B's 128 experts, top-8
PUBLISHED_LRU = (0.424, 0.647, 0.810, 0.918)
PUBLISHED_BELADY = (0.608, 0.784, 0.888, 0.929)
PUBLISHED_OVERLAP = (0.079, 0.57, 0.206)  # first layer, middle layers (0.54-0.60), last layer
PUBLISHED_TOP16 = (0.55, 0.62)
PUBLISHED_ENTROPY = (0.76, 0.81)
HIT_TOLERANCE = 0.03
OVERLAP_TOLERANCE = 0.05
SHUFFLE_MIN = 0.03  # shuffling must cost an LRU at 25% of the experts at least this much
TARGET_SHAPE = "qwen3-30b-a3b"  # the shape the published figures were measured on
FLAT_SHAPE = "flat-512"  # the 512-expert top-10 shape of the second set of published figures
HOT_TOP = 32  # the hot list learned on half of a workload, scored on the other half


@dataclass(frozen=True)
class Targets:
    """What a shape's routing is held to: hit rates per slot count (+/- HIT_TOLERANCE), overlaps
    (+/- OVERLAP_TOLERANCE), a least shuffle cost, and for the flat shape the half-size and hot-list
    figures (+/- HIT_TOLERANCE). ``per_document``: hit rates are measured with each corpus document
    (topic) one stream, the cache warm across its paragraphs, else emptied at every prompt."""

    source: str
    lru: dict[int, float]
    belady: dict[int, float]
    overlap: tuple[float | None, float | None, float | None] = (None, None, None)  # first, middle third, last
    overlap_mean: float | None = None
    shuffle_min: float | None = SHUFFLE_MIN
    static_miss_half: float | None = None  # held-out static hot set at half the experts: misses / selections
    lru_miss_half: float | None = None     # warm LRU at half the experts: misses / selections
    hot_cover: float | None = None         # a top-HOT_TOP list of one half of the documents on the other half
    per_document: bool = False
    extra_sizes: tuple[int, ...] = ()      # slot counts measured beside the shape's FRACTIONS
    shown: dict[str, str] = field(default_factory=dict)  # row -> the source's own text (ranges)


def qwen3_equivalent(slots: int, n_expert: int, k: int) -> float:
    """The Qwen3-30B-A3B cache size (of 128 experts, top-8) that the rule for shapes without a published
    trace reads the published curve at: the geometric mean of the two plain scalings, the same share of
    the experts (slots * 128 / n_expert) and the same slots per selected expert (slots * 8 / k). On the
    512-expert top-10 trace it reads 49 slots as 21.9, where the published curve gives an LRU of 0.721
    and an oracle of 0.831 against the measured 0.736 and ~0.86."""
    return math.sqrt(slots * 128 / n_expert * slots * 8 / k)


def published_at(curve: Sequence[float], equivalent: float) -> float | None:
    """The published curve interpolated linearly in log2(slots); None outside the measured 8-64 slots."""
    lo, hi = PUBLISHED_SLOTS[0], PUBLISHED_SLOTS[-1]
    if not lo - 1e-9 <= equivalent <= hi + 1e-9:
        return None
    return float(np.interp(math.log2(equivalent), np.log2(PUBLISHED_SLOTS), curve))


def derived_targets(sh: Shape) -> Targets:
    """Targets for a shape with no published trace (gpt-oss): each hit rate is the Qwen3-30B-A3B curve
    read at ``qwen3_equivalent`` (none outside its measured range), the overlaps by depth are
    Qwen3-30B-A3B's (the share of a token's experts the next token reuses: 0.427 there and 0.46 on the
    512-expert top-10 trace, so it does not follow k or the expert count), and shuffling costs >= 3 points."""
    lru, bel = {}, {}
    for s in sizes_for(sh):
        eq = qwen3_equivalent(s, sh.n_expert, sh.n_expert_used)
        a, b = published_at(PUBLISHED_LRU, eq), published_at(PUBLISHED_BELADY, eq)
        if a is not None and b is not None:
            lru[s], bel[s] = round(a, 3), round(b, 3)
    return Targets(f"derived from Qwen3-30B-A3B's published figures (top-{sh.n_expert_used} of {sh.n_expert}: "
                   "docs/synthetic-models.md, the rule)", lru, bel, PUBLISHED_OVERLAP)


QWEN3_TARGETS = Targets(
    "published (Qwen3-30B-A3B, gajsanders/moe-trace)", dict(zip(PUBLISHED_SLOTS, PUBLISHED_LRU)),
    dict(zip(PUBLISHED_SLOTS, PUBLISHED_BELADY)), PUBLISHED_OVERLAP,
    shown={"overlap middle": "0.54-0.60", "overlap mean": "0.427", "top16": "0.55-0.62", "entropy": "0.76-0.81",
           "shuffle": "several pts"})
# Qwen3.8-Flash-Next (512 experts, top-10): davetha/r9700-lru-expert-cache docs/LOCALITY.md,
# jiro-prog/llamacpp-moe-expert-cache docs/findings.md, llama.cpp PR #27861. A long-running cache, so its
# figures are measured warm; two consecutive tokens' union of 15.4 of 20 is an overlap of 4.6 / 10.
FLAT_TARGETS = Targets(
    "published (a 512-expert top-10 model: r9700-lru-expert-cache, llamacpp-moe-expert-cache)", {49: 0.736},
    {49: 0.86}, overlap_mean=0.46, static_miss_half=0.233, lru_miss_half=0.047, hot_cover=0.10, per_document=True,
    extra_sizes=(49,), shown={"belady 49": "~0.86", "hot": "~0.10"})


def targets_for(shape: str | Shape) -> Targets | None:
    """The targets of a preset shape (None: the shape is not calibrated against anything)."""
    name = shape if isinstance(shape, str) else next((n for n, s in SHAPES.items() if s == shape), None)
    if name == TARGET_SHAPE:
        return QWEN3_TARGETS
    if name == FLAT_SHAPE:
        return FLAT_TARGETS
    if name in ("gpt-oss-20b", "gpt-oss-120b"):
        return derived_targets(SHAPES[name])
    return None


def sizes_for(sh: Shape, targets: Targets | None = None) -> tuple[int, ...]:
    """Slots per layer the report measures: FRACTIONS of the experts (at least k), and the targets' own."""
    out = [max(sh.n_expert_used, round(f * sh.n_expert)) for f in FRACTIONS]
    out += list(targets.extra_sizes if targets else ())
    return tuple(sorted(set(out)))


@dataclass(frozen=True)
class Check:
    name: str
    value: float
    target: str
    ok: bool
    want: float = 0.0
    tol: float | None = None  # None: ``value`` must be at least ``want``


@dataclass(frozen=True)
class CalibrationReport:
    shape: str
    seeds: tuple[int, ...]
    routing: RoutingConfig
    slots: tuple[int, ...]            # per layer: FRACTIONS of the experts and the targets' own sizes
    lru: tuple[float, ...]            # hit rate at each size, seeds pooled
    belady: tuple[float, ...]
    overlap: tuple[float, float, float]  # first layer, middle third, last layer
    overlap_mean: float
    top16: float
    entropy: float
    shuffle_cost: float               # LRU at 25% in order minus shuffled
    n_prompts: int
    n_tokens: int
    n_expert: int = 128
    per_document: bool = False        # hit rates with each document one stream (warm), else per prompt
    static_miss_half: float = 0.0     # held out by halves of the documents: misses / selections at half
    lru_miss_half: float = 0.0
    hot_cover: float = 0.0
    targets: Targets | None = None

    def checks(self) -> list[Check]:
        """The shape's targets (none for a shape without them)."""
        t = self.targets
        if t is None:
            return []
        out = []

        def near(name: str, got: float, want: float | None, tol: float) -> None:
            if want is not None:
                out.append(Check(name, got, f"{want:.3f} +/- {tol}", abs(got - want) <= tol, want, tol))

        for name, got_all, want_all in (("LRU", self.lru, t.lru), ("Belady", self.belady, t.belady)):
            for s, got in zip(self.slots, got_all):
                near(f"{name} at {s} slots ({s / self.n_expert:.1%})", got, want_all.get(s), HIT_TOLERANCE)
        for name, got, want in zip(("first", "middle", "last"), self.overlap, t.overlap):
            near(f"overlap, {name} layer(s)", got, want, OVERLAP_TOLERANCE)
        near("overlap, all layers", self.overlap_mean, t.overlap_mean, OVERLAP_TOLERANCE)
        near("static at half: misses", self.static_miss_half, t.static_miss_half, HIT_TOLERANCE)
        near("warm LRU at half: misses", self.lru_miss_half, t.lru_miss_half, HIT_TOLERANCE)
        near(f"top-{HOT_TOP} of one half on the other", self.hot_cover, t.hot_cover, HIT_TOLERANCE)
        if t.shuffle_min is not None:
            out.append(Check("shuffle cost, LRU at 25%", self.shuffle_cost, f">= {t.shuffle_min}",
                             self.shuffle_cost >= t.shuffle_min, t.shuffle_min))
        return out

    def calibration_label(self) -> str:
        """The shape's calibration (calibration.py), and whether this run's router knobs are its calibrated ones."""
        cal = calibration_of(self.shape)
        changed = cal.preset and self.routing != routing_for(cal.shape)
        return cal.label + ("; this run's router knobs differ from the shape's setting, so its figures are not "
                            "the calibration's" if changed else "")

    def format(self) -> str:
        t = self.targets
        shown = t.shown if t else {}
        how = "each document one stream (warm)" if self.per_document else "the cache emptied at every prompt"
        lines = [f"shape {self.shape}: seeds {', '.join(map(str, self.seeds))}; {self.n_prompts} prompts "
                 f"(corpus paragraphs), {self.n_tokens} tokens per seed; hit rates per layer, {how}; routing "
                 f"{describe(self.routing)}", f"targets: {t.source if t else 'none for this shape'}",
                 f"calibration: {self.calibration_label()}", "", f"{'':36} {'synthetic':>10} {'target':>12}"]

        def row(label: str, got: float, want: float | None, key: str = "") -> None:
            text = shown.get(key) or (f"{want:.3f}" if want is not None else "")
            lines.append(f"{label:36} {got:10.3f} {text:>12}")

        for name, got_all, want_all in (("LRU", self.lru, t.lru if t else {}), ("Belady", self.belady, t.belady if t else {})):
            for s, got in zip(self.slots, got_all):
                row(f"{name}, {s} slots ({s / self.n_expert:.1%})", got, want_all.get(s), f"{name.lower()} {s}")
        for name, got, i in zip(("first layer", "middle third", "last layer"), self.overlap, range(3)):
            row(f"adjacent overlap, {name}", got, t.overlap[i] if t else None, f"overlap {name.split()[0]}")
        row("adjacent overlap, all layers", self.overlap_mean, t.overlap_mean if t else None, "overlap mean")
        row("per prompt: top-16 share", self.top16, None, "top16")
        row("per prompt: normalised entropy", self.entropy, None, "entropy")
        row("shuffle cost, LRU at 25%", self.shuffle_cost, None, "shuffle")
        if t is not None and t.static_miss_half is not None:
            row("static hot set at 50%: misses", self.static_miss_half, t.static_miss_half)
            row("warm LRU at 50%: misses", self.lru_miss_half, t.lru_miss_half)
            row(f"top-{HOT_TOP} of one half, on the other", self.hot_cover, t.hot_cover, "hot")
            lines.append(f"{f'  (uniform: {HOT_TOP / self.n_expert:.3f})':36}")
        checks = self.checks()
        bad = [c for c in checks if not c.ok]
        if checks:
            lines += ["", f"targets: {len(checks) - len(bad)} of {len(checks)} met"
                      + "".join(f"\n  missed: {c.name} {c.value:.3f} (target {c.target})" for c in bad)]
        return "\n".join(lines)


def describe(r: RoutingConfig) -> str:
    return ", ".join(f"{f.name}={getattr(r, f.name):g}" for f in fields(r))


def by_document(routes: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The corpus's paragraphs (corpus_routes' order) joined into one stream per document (topic)."""
    out, at = [], 0
    for text in load_corpus().values():
        n = len(paragraphs(text))
        out.append(np.concatenate(routes[at:at + n]))
        at += n
    if at != len(routes):
        raise ValueError(f"by_document: {len(routes)} prompts, the corpus has {at} paragraphs")
    return out


def half_figures(docs: Sequence[np.ndarray], n_expert: int) -> tuple[float, float, float]:
    """(static misses, warm LRU misses, top-HOT_TOP coverage), misses / selections: the static hot set of
    half the experts and the top-HOT_TOP list per layer are learned on one half of the documents and scored
    on the other, both ways round; the LRU of half the experts is warm over each document."""
    half = len(docs) // 2
    parts = (docs[:half], docs[half:])
    miss = cover = total = 0
    for train, test in (parts, parts[::-1]):
        prof = expert_counts(train, n_expert)
        got = expert_counts(test, n_expert)
        order = np.argsort(-prof, axis=1, kind="stable")
        held = np.take_along_axis(got, order[:, :n_expert // 2], axis=1).sum()
        cover += int(np.take_along_axis(got, order[:, :HOT_TOP], axis=1).sum())
        miss += int(got.sum() - held)
        total += int(got.sum())
    h, n = lru_per_prompt(docs, n_expert, n_expert // 2)
    return miss / total, 1.0 - h / n, cover / total


def measure(shape: str | Shape, seeds: Sequence[int] = (0, 1, 2), routing: RoutingConfig | None = None,
            sizes: Sequence[int] | None = None) -> CalibrationReport:
    """The report for ``shape``'s routing (its calibrated default unless ``routing``), seeds pooled; the hit
    rates at ``sizes`` slots per layer (default ``sizes_for``: a test may ask for its targets' alone)."""
    sh = get_shape(shape)
    r = routing or routing_for(sh)
    t = targets_for(shape)
    n_e = sh.n_expert
    slots = tuple(sizes) if sizes is not None else sizes_for(sh, t)
    per_doc = bool(t and t.per_document)
    lru = np.zeros((len(slots), 2))
    bel = np.zeros((len(slots), 2))
    ov, conc, shuf, half = [], [], [], []
    n_tokens = n_prompts = 0
    # the design depends on the routing only through context and layer_corr: the search's other knobs reuse it
    base = replace(routing_for(sh), context=r.context, layer_corr=r.layer_corr)
    for seed in seeds:
        routes = corpus_routes(build_design(sh, seed, base), r)
        n_prompts, n_tokens = len(routes), sum(x.shape[0] for x in routes)
        streams = by_document(routes) if per_doc else routes
        for i, s in enumerate(slots):
            lru[i] += lru_per_prompt(streams, n_e, s)
            bel[i] += belady_per_prompt(streams, n_e, s)
        ov.append(adjacent_overlap(routes))
        conc.append(prompt_concentration(routes, n_e))
        quarter = max(sh.n_expert_used, round(n_e / 4))
        h_in, n_in = lru_per_prompt(streams, n_e, quarter)
        h_sh, n_sh = lru_per_prompt(shuffled(streams, seed), n_e, quarter)
        shuf.append(h_in / n_in - h_sh / n_sh)
        if t is not None and t.static_miss_half is not None:
            half.append(half_figures(by_document(routes), n_e))
    o = np.mean(ov, axis=0)
    n_l = o.size
    middle = float(o[n_l // 3 : max(n_l // 3 + 1, 2 * n_l // 3)].mean())
    hf = np.mean(half, axis=0) if half else np.zeros(3)
    return CalibrationReport(
        shape=shape if isinstance(shape, str) else sh.describe(), seeds=tuple(seeds), routing=r, slots=slots,
        lru=tuple(float(h / n) for h, n in lru), belady=tuple(float(h / n) for h, n in bel),
        overlap=(float(o[0]), middle, float(o[-1])), overlap_mean=float(o.mean()),
        top16=float(np.mean([c[0] for c in conc])), entropy=float(np.mean([c[1] for c in conc])),
        shuffle_cost=float(np.mean(shuf)), n_prompts=n_prompts, n_tokens=n_tokens, n_expert=n_e,
        per_document=per_doc, static_miss_half=float(hf[0]), lru_miss_half=float(hf[1]), hot_cover=float(hf[2]),
        targets=t)


def error(rep: CalibrationReport) -> float:
    """Squared distance to the shape's targets, in units of their tolerances (a shuffle cost under its
    least counts as far as it falls short)."""
    e = 0.0
    for c in rep.checks():
        if c.tol is None:
            e += (max(0.0, c.want - c.value) / HIT_TOLERANCE) ** 2
        else:
            e += ((c.value - c.want) / c.tol) ** 2
    return float(e)


SEARCHED = ("skew", "topic", "recency", "recency_tokens", "token", "first", "last", "rise", "fall")


def search(shape: str | Shape, seeds: Sequence[int], start: RoutingConfig, rounds: int = 3,
           log: Callable[[str], None] = print) -> tuple[RoutingConfig, CalibrationReport]:
    """Coordinate descent on the knobs in SEARCHED, halving the steps each round."""
    steps = {"skew": 0.2, "topic": 0.5, "recency": 0.5, "recency_tokens": 2.0, "token": 0.1, "first": 0.05, "last": 0.05,
             "rise": 0.05, "fall": 0.1}
    best = start
    rep = measure(shape, seeds, best)
    err = error(rep)
    log(f"start {describe(best)}: error {err:.5f}")
    for _ in range(rounds):
        for name in SEARCHED:
            for sign in (1, -1):
                value = round(max(0.0, getattr(best, name) + sign * steps[name]), 4)
                if name == "recency_tokens":
                    value = max(1.0, value)
                try:
                    cand = replace(best, **{name: value})
                except LlamaMoeError:
                    continue  # out of the knob's range
                r = measure(shape, seeds, cand)
                if error(r) < err:
                    best, rep, err = cand, r, error(r)
                    log(f"  {describe(best)}: error {err:.5f}")
                    break
        steps = {k: v / 2 for k, v in steps.items()}
    return best, rep
