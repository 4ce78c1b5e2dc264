"""The synthetic routing beside published measurements of real routing (numpy only).

Measured as the published figures were: every corpus paragraph is one prompt; each layer has
its own cache, emptied at every prompt; in the LRU a token's own experts never evict each
other; hit rate = hits / selections; overlap = mean |S_t & S_t-1| / k over adjacent tokens of a
prompt; the shuffle keeps each prompt's tokens and destroys their order.

Published (Qwen3-30B-A3B, 4-bit MLX build, 25 prompts, 3,225 decode tokens, cache reset per
prompt; gajsanders/moe-trace, docs/findings 004-007): per-layer LRU at 8 / 16 / 32 / 64 of 128
experts 0.424 / 0.647 / 0.810 / 0.918, the oracle (Belady) 0.608 / 0.784 / 0.888 / 0.929;
adjacent overlap 0.079 at layer 0, 0.54-0.60 in the middle layers, 0.206 at layer 47; per
prompt the hottest 16 experts take 0.55-0.62 of a layer's picks, normalised entropy 0.76-0.81.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace

import numpy as np

from llama_moe.errors import LlamaMoeError
from llama_moe.synth.config import RoutingConfig, routing_for
from llama_moe.synth.design import build_design
from llama_moe.synth.hitrate import adjacent_overlap, belady_per_prompt, lru_per_prompt, prompt_concentration, shuffled
from llama_moe.synth.routing import corpus_routes
from llama_moe.synth.shapes import Shape, get_shape

FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2)  # 8 / 16 / 32 / 64 of 128 experts
PUBLISHED_LRU = (0.424, 0.647, 0.810, 0.918)
PUBLISHED_BELADY = (0.608, 0.784, 0.888, 0.929)
PUBLISHED_OVERLAP = (0.079, 0.57, 0.206)  # first layer, middle layers (0.54-0.60), last layer
PUBLISHED_TOP16 = (0.55, 0.62)
PUBLISHED_ENTROPY = (0.76, 0.81)
HIT_TOLERANCE = 0.03
OVERLAP_TOLERANCE = 0.05
SHUFFLE_MIN = 0.03  # shuffling must cost an LRU at 25% of the experts at least this much
TARGET_SHAPE = "qwen3-30b-a3b"  # the shape the published figures were measured on


@dataclass(frozen=True)
class Check:
    name: str
    value: float
    target: str
    ok: bool


@dataclass(frozen=True)
class CalibrationReport:
    shape: str
    seeds: tuple[int, ...]
    routing: RoutingConfig
    slots: tuple[int, ...]            # per layer, at FRACTIONS of the experts
    lru: tuple[float, ...]            # hit rate at each size, seeds pooled
    belady: tuple[float, ...]
    overlap: tuple[float, float, float]  # first layer, middle third, last layer
    overlap_mean: float
    top16: float
    entropy: float
    shuffle_cost: float               # LRU at 25% in order minus shuffled
    n_prompts: int
    n_tokens: int

    def checks(self) -> list[Check]:
        """The targets (on the shape the published figures come from)."""
        out = []
        for i, f in enumerate(FRACTIONS):
            for name, got, want in (("LRU", self.lru[i], PUBLISHED_LRU[i]), ("Belady", self.belady[i], PUBLISHED_BELADY[i])):
                out.append(Check(f"{name} at {f:.1%}", got, f"{want:.3f} +/- {HIT_TOLERANCE}", abs(got - want) <= HIT_TOLERANCE))
        for name, got, want in zip(("first", "middle", "last"), self.overlap, PUBLISHED_OVERLAP):
            out.append(Check(f"overlap, {name} layer(s)", got, f"{want:.3f} +/- {OVERLAP_TOLERANCE}",
                             abs(got - want) <= OVERLAP_TOLERANCE))
        out.append(Check("shuffle cost, LRU at 25%", self.shuffle_cost, f">= {SHUFFLE_MIN}", self.shuffle_cost >= SHUFFLE_MIN))
        return out

    def format(self) -> str:
        lines = [f"shape {self.shape}: seeds {', '.join(map(str, self.seeds))}; {self.n_prompts} prompts "
                 f"(corpus paragraphs), {self.n_tokens} tokens per seed; routing {describe(self.routing)}",
                 "", f"{'':32} {'synthetic':>10} {'published':>12}"]
        for i, f in enumerate(FRACTIONS):
            lines.append(f"{f'LRU, {self.slots[i]} slots ({f:.1%})':32} {self.lru[i]:10.3f} {PUBLISHED_LRU[i]:12.3f}")
        for i, f in enumerate(FRACTIONS):
            lines.append(f"{f'Belady, {self.slots[i]} slots ({f:.1%})':32} {self.belady[i]:10.3f} {PUBLISHED_BELADY[i]:12.3f}")
        for name, got, want in zip(("first layer", "middle third", "last layer"), self.overlap, ("0.079", "0.54-0.60", "0.206")):
            lines.append(f"{f'adjacent overlap, {name}':32} {got:10.3f} {want:>12}")
        lines.append(f"{'adjacent overlap, all layers':32} {self.overlap_mean:10.3f} {0.427:12.3f}")
        lines.append(f"{'per prompt: top-16 share':32} {self.top16:10.3f} {'0.55-0.62':>12}")
        lines.append(f"{'per prompt: normalised entropy':32} {self.entropy:10.3f} {'0.76-0.81':>12}")
        lines.append(f"{'shuffle cost, LRU at 25%':32} {self.shuffle_cost:10.3f} {'several pts':>12}")
        if self.shape == TARGET_SHAPE:
            checks = self.checks()
            bad = [c for c in checks if not c.ok]
            lines += ["", f"targets: {len(checks) - len(bad)} of {len(checks)} met"
                      + "".join(f"\n  missed: {c.name} {c.value:.3f} (target {c.target})" for c in bad)]
        else:
            lines += ["", f"(the published figures are of {TARGET_SHAPE}, top-8 of 128: the targets apply to that shape)"]
        return "\n".join(lines)


def describe(r: RoutingConfig) -> str:
    return ", ".join(f"{f.name}={getattr(r, f.name):g}" for f in fields(r))


def measure(shape: str | Shape, seeds: Sequence[int] = (0, 1, 2), routing: RoutingConfig | None = None) -> CalibrationReport:
    """The report for ``shape``'s routing (its calibrated default unless ``routing``), seeds pooled."""
    sh = get_shape(shape)
    r = routing or routing_for(sh)
    n_e = sh.n_expert
    slots = tuple(max(sh.n_expert_used, round(f * n_e)) for f in FRACTIONS)
    lru = np.zeros((len(FRACTIONS), 2))
    bel = np.zeros((len(FRACTIONS), 2))
    ov, conc, shuf = [], [], []
    n_tokens = n_prompts = 0
    for seed in seeds:
        routes = corpus_routes(build_design(sh, seed, r), r)
        n_prompts, n_tokens = len(routes), sum(x.shape[0] for x in routes)
        for i, s in enumerate(slots):
            lru[i] += lru_per_prompt(routes, n_e, s)
            bel[i] += belady_per_prompt(routes, n_e, s)
        ov.append(adjacent_overlap(routes))
        conc.append(prompt_concentration(routes, n_e))
        quarter = slots[2]
        h_in, n_in = lru_per_prompt(routes, n_e, quarter)
        h_sh, n_sh = lru_per_prompt(shuffled(routes, seed), n_e, quarter)
        shuf.append(h_in / n_in - h_sh / n_sh)
    o = np.mean(ov, axis=0)
    n_l = o.size
    middle = float(o[n_l // 3 : max(n_l // 3 + 1, 2 * n_l // 3)].mean())
    return CalibrationReport(
        shape=shape if isinstance(shape, str) else sh.describe(), seeds=tuple(seeds), routing=r, slots=slots,
        lru=tuple(float(h / n) for h, n in lru), belady=tuple(float(h / n) for h, n in bel),
        overlap=(float(o[0]), middle, float(o[-1])), overlap_mean=float(o.mean()),
        top16=float(np.mean([c[0] for c in conc])), entropy=float(np.mean([c[1] for c in conc])),
        shuffle_cost=float(np.mean(shuf)), n_prompts=n_prompts, n_tokens=n_tokens)


def error(rep: CalibrationReport) -> float:
    """Squared distance to the published figures (hit rates and overlaps)."""
    e = sum((a - b) ** 2 for a, b in zip(rep.lru, PUBLISHED_LRU))
    e += sum((a - b) ** 2 for a, b in zip(rep.belady, PUBLISHED_BELADY))
    e += sum((a - b) ** 2 for a, b in zip(rep.overlap, PUBLISHED_OVERLAP))
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
