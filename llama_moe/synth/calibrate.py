"""Calibrate the default RoutingConfig against expert-cache hit rates measured on real models.

    python -m llama_moe.synth.calibrate --shape qwen3-30b-a3b            # measure the defaults
    python -m llama_moe.synth.calibrate --shape qwen3-30b-a3b --search   # grid-search skew/locality

Routing is computed in numpy (routing.py) for every corpus paragraph, each as its own sequence.
A static profile keeps each layer's most selected 1/6 of experts on the train paragraphs and is
scored on the held-out test paragraphs; a per-layer LRU of 1/8 of the experts replays the test
paragraphs in order. Both are averaged over several seeds.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from llama_moe.synth.config import RoutingConfig
from llama_moe.synth.corpus import split_paragraphs
from llama_moe.synth.design import Design, build_design
from llama_moe.synth.hitrate import lru_hit_rate, static_hit_rate
from llama_moe.synth.routing import route
from llama_moe.synth.shapes import Shape, get_shape

# Strata: a static profile of 4,105 of 24,576 expert slots (1/6) hit 0.6447 of selections.
STATIC_TARGET = 0.6447
STATIC_FRACTION = 1 / 6
# llama.cpp PR #27861: an LRU of 64 of 512 experts per layer (1/8) hit about 67%.
LRU_TARGET = 0.67
LRU_FRACTION = 1 / 8


@dataclass(frozen=True)
class HitRates:
    static: float
    lru: float
    per_seed: tuple[tuple[float, float], ...] = ()

    def error(self) -> float:
        return float(np.hypot(self.static - STATIC_TARGET, self.lru - LRU_TARGET))


def _token_sets(design: Design) -> tuple[list[list[int]], list[list[int]]]:
    split = split_paragraphs()
    enc = design.tokenizer.encode
    return [enc(p) for p in split.train_paragraphs()], [enc(p) for p in split.test_paragraphs()]


def measure(designs: Sequence[Design], routing: RoutingConfig) -> HitRates:
    """Hit rates averaged over ``designs`` (one per seed) under ``routing``'s skew/locality."""
    statics, lrus = [], []
    for d in designs:
        train, test = _token_sets(d)
        n_e = d.shape.n_expert
        rtr = [route(t, d, routing) for t in train]
        rte = [route(t, d, routing) for t in test]
        statics.append(static_hit_rate(rtr, rte, n_e, STATIC_FRACTION))
        lrus.append(lru_hit_rate(rte, n_e, LRU_FRACTION))
    return HitRates(float(np.mean(statics)), float(np.mean(lrus)), tuple(zip(statics, lrus)))


def search(designs: Sequence[Design], base: RoutingConfig, log=print) -> tuple[RoutingConfig, HitRates]:
    """Coarse grid, then a fine grid around the best point; minimises the distance to both targets."""
    best: tuple[float, RoutingConfig, HitRates] | None = None

    def scan(skews: np.ndarray, locs: np.ndarray) -> None:
        nonlocal best
        for s in skews:
            for loc in locs:
                cfg = replace(base, skew=round(float(s), 3), locality=round(float(loc), 3))
                hr = measure(designs, cfg)
                log(f"  skew={cfg.skew:<5} locality={cfg.locality:<5} static={hr.static:.4f} lru={hr.lru:.4f}")
                if best is None or hr.error() < best[0]:
                    best = (hr.error(), cfg, hr)

    scan(np.arange(0.6, 2.01, 0.2), np.arange(1.0, 7.01, 1.0))
    assert best is not None
    c = best[1]
    scan(np.arange(max(0.0, c.skew - 0.15), c.skew + 0.151, 0.05),
         np.arange(max(0.0, c.locality - 0.75), c.locality + 0.751, 0.25))
    return best[1], best[2]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m llama_moe.synth.calibrate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="qwen3-30b-a3b")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds to average over")
    ap.add_argument("--skew", type=float, default=None)
    ap.add_argument("--locality", type=float, default=None)
    ap.add_argument("--search", action="store_true", help="grid-search skew and locality")
    args = ap.parse_args(argv)

    shape: Shape = get_shape(args.shape)
    base = RoutingConfig()
    if args.skew is not None:
        base = replace(base, skew=args.skew)
    if args.locality is not None:
        base = replace(base, locality=args.locality)
    seeds = [int(s) for s in args.seeds.split(",")]
    designs = [build_design(shape, s, base) for s in seeds]
    n_e = shape.n_expert
    print(f"shape {args.shape}: {shape.n_layer} layers, {n_e} experts, top-{shape.n_expert_used}; seeds {seeds}")
    print(f"static profile: {round(STATIC_FRACTION * n_e)} of {n_e} experts per layer (1/6), "
          f"built on train paragraphs, scored on test paragraphs; target {STATIC_TARGET}")
    print(f"LRU: {round(LRU_FRACTION * n_e)} of {n_e} experts per layer (1/8), over test paragraphs; target {LRU_TARGET}")
    if args.search:
        cfg, hr = search(designs, base)
        print(f"best: skew={cfg.skew} locality={cfg.locality} -> static {hr.static:.4f}, lru {hr.lru:.4f}")
    else:
        hr = measure(designs, base)
        for seed, (s_hr, l_hr) in zip(seeds, hr.per_seed):
            print(f"  seed {seed}: static {s_hr:.4f}, lru {l_hr:.4f}")
        print(f"skew={base.skew} locality={base.locality} context={base.context} layer_corr={base.layer_corr}: "
              f"static {hr.static:.4f} (target {STATIC_TARGET}), lru {hr.lru:.4f} (target {LRU_TARGET})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
