"""Per-layer miss curves and a split of a slot budget across layers that follows them.

A layer's miss curve is its misses at every cache size 0..n_expert, from one pass over a routing:

- ``lru``: Mattson's stack distances. Per layer, each looked-up expert's distance is the number of distinct
  experts used since its last use (a ubatch's experts are used together, ordered by their place in the
  ubatch's list, and never evict each other); an LRU of C slots hits it iff the distance is under C. For
  one-token ubatches (trace files) it is an LRU of every size at once, ties among a token's experts going
  by their place in its list (the engine's go by slot: a few percent apart). A ubatch with more distinct
  experts than C slots (several tokens, or fewer slots than k) hits what is resident and misses the rest, as
  upload mode's split counts it; the stack then puts all its experts on top, where the engine keeps its hits
  and uploads its first misses into the slots left (the others run on the CPU): close, not exact.
  Counted per block of tokens (the folds of a held-out estimate), so that a fold's train side is the whole
  less the fold, from one pass.
- ``static`` (``static_curves``): the hybrid from a profile: at C slots a layer holds its C most selected
  experts, and misses the rest of its selections.

A layer held whole (C = n_expert) misses nothing: it needs no lookup.

``split_slots`` gives each layer the slots that minimise the total misses for a budget: greedy by marginal
gain per byte on each curve's lower convex hull (optimal for the hulls; the curves themselves are close to
convex), every layer at least ``min_slots``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ..errors import CacheBudgetError, ToolInputError
from .policies.base import _chunks
from .routes import Routes
from .tracefiles import TraceRoutes

CURVES = ("lru", "static")
_CHUNK_TOKENS = 1024


@dataclass(frozen=True)
class MissCurves:
    """``misses[b, j, C]``: misses of layer ``layers[j]`` in block ``b`` with C slots (C = 0..n_expert);
    ``lookups[b, j]``: the selections it looked up there (the misses at 0 slots)."""

    policy: str
    layers: tuple[int, ...]
    n_expert: int
    k: int
    bounds: tuple[tuple[int, int], ...]
    misses: np.ndarray   # [blocks, n_layers, n_expert + 1] int64
    lookups: np.ndarray  # [blocks, n_layers] int64

    def total(self, leave_out: int | None = None) -> np.ndarray:
        """[n_layers, n_expert + 1] the misses summed over the blocks, less block ``leave_out``."""
        m = self.misses.sum(axis=0)
        return m if leave_out is None else m - self.misses[leave_out]


def lru_miss_curves(routes: Routes | TraceRoutes, n_expert: int, bounds: Sequence[tuple[int, int]] | None = None,
                    progress: Callable[[int, int], None] | None = None) -> MissCurves:
    """LRU miss curves of every layer by stack distance, per block ``bounds`` (default: one block)."""
    bounds = tuple(bounds) if bounds else ((0, routes.n_tokens),)
    n_l = len(routes.layers)
    edges = np.array([a for a, _ in bounds] + [bounds[-1][1]], dtype=np.int64)
    # thresholds: a selection hits at C slots iff C >= its threshold; counted per (block, layer, threshold)
    hist = np.zeros((len(bounds), n_l, n_expert + 2), dtype=np.int64)  # the last column: never (first use)
    stamp = np.full((n_l, n_expert + 1), -1.0)  # last use, -1 never; the last column takes the -1 padding
    rows = np.arange(n_l)[:, None]
    clock = 0
    for chunk in _chunks(routes, _CHUNK_TOKENS, progress):
        d_all = chunk.distinct.astype(np.int64)      # [ubatches, n_layers, w], -1 padded
        counted = chunk.counted                       # [ubatches, n_layers]
        starts = chunk.starts[:-1]
        for u in range(d_all.shape[0]):
            block = int(np.searchsorted(edges, clock + starts[u], side="right") - 1)
            d = np.where(counted[u][:, None], d_all[u], -1)
            d = np.where(d < 0, n_expert, d)
            valid = d < n_expert
            if not valid.any():
                continue
            mine = stamp[rows, d]
            dist = (stamp[:, None, :n_expert] > mine[:, :, None]).sum(axis=2)  # distinct experts used since
            thr = np.where(mine >= 0, dist + 1, n_expert + 1)
            thr = np.minimum(thr, n_expert + 1)
            r, c = np.nonzero(valid)
            np.add.at(hist[block], (r, thr[r, c]), 1)
            w = d.shape[1]
            stamp[r, d[r, c]] = clock + starts[u] + (c + 1) / (w + 1)
        clock += chunk.n_tokens
    return _curves("lru", routes, n_expert, bounds, hist)


def static_curves(counts: np.ndarray) -> np.ndarray:
    """[n_layers, n_expert + 1] static-profile miss curves from selection counts [n_layers, n_expert]: at C
    slots a layer holds its C most selected experts and misses the rest (none when held whole)."""
    n_l, n_expert = counts.shape
    held = np.cumsum(-np.sort(-counts, axis=1), axis=1)
    out = np.empty((n_l, n_expert + 1), dtype=np.int64)
    out[:, 0] = counts.sum(axis=1)
    out[:, 1:] = out[:, :1] - held
    out[:, n_expert] = 0
    return out


def _curves(policy: str, routes: Routes | TraceRoutes, n_expert: int, bounds: tuple[tuple[int, int], ...],
            hist: np.ndarray) -> MissCurves:
    lookups = hist.sum(axis=2)
    hits = np.cumsum(hist[:, :, :n_expert + 1], axis=2)  # hits at C slots: thresholds <= C
    misses = lookups[:, :, None] - hits
    misses[:, :, n_expert] = 0  # held whole: no lookup
    return MissCurves(policy, tuple(routes.layers), n_expert, routes.k, bounds, misses, lookups)


def lower_hull(m: Sequence[int] | np.ndarray, lo: int, hi: int | None = None) -> list[int]:
    """The slot counts in [lo, hi] (by default to the last point) of the lower convex hull of the points (C, m[C])."""
    pts: list[int] = []
    for c in range(lo, (len(m) - 1 if hi is None else hi) + 1):
        while len(pts) >= 2:
            a, b = pts[-2], pts[-1]
            # b is above the chord from a to c: not on the lower hull
            if (m[b] - m[a]) * (c - a) >= (m[c] - m[a]) * (b - a):
                pts.pop()
            else:
                break
        pts.append(c)
    return pts


def split_slots(curves: np.ndarray, layers: Sequence[int], budget: int, min_slots: int = 1,
                weights: Sequence[int] | None = None) -> dict[int, int]:
    """Slots per layer (``layers[j]`` -> C) that minimise the summed misses of ``curves`` [n_layers,
    n_expert + 1] for a budget of ``budget`` weight units (default weight 1 a slot: ``budget`` slots in
    all; with ``weights``, e.g. each layer's bytes per expert, the budget is in those units). Every layer
    gets at least ``min_slots`` (capped at its experts); the rest goes greedily to the largest marginal
    gain per unit on each curve's lower convex hull. What no layer can use (all held whole) is left over."""
    n_l, width = curves.shape
    n_expert = width - 1
    w = [1] * n_l if weights is None else [int(x) for x in weights]
    if len(w) != n_l or min(w, default=1) < 1:
        raise ToolInputError("split_slots: one positive weight per layer")
    if min_slots < 1:
        raise ToolInputError(f"split_slots: min_slots must be >= 1, got {min_slots}")
    lo = min(min_slots, n_expert)
    alloc = [lo] * n_l
    left = budget - lo * sum(w)
    if left < 0:
        raise CacheBudgetError(f"a budget of {budget} cannot give each of the {n_l} layers {lo} slots")
    segments = []
    for j in range(n_l):
        pts = lower_hull(curves[j], lo)
        for a, b in zip(pts[:-1], pts[1:]):
            gain = (curves[j, a] - curves[j, b]) / ((b - a) * w[j])
            if gain > 0:
                segments.append((-gain, j, a, b))
    segments.sort()
    blocked: set[int] = set()
    for _, j, a, b in segments:
        if j in blocked or alloc[j] != a:
            continue
        n = min(b - a, left // w[j])
        alloc[j] += n
        left -= n * w[j]
        if n < b - a:
            blocked.add(j)  # its later segments gain less than this one
    return {il: int(c) for il, c in zip(layers, alloc)}


__all__ = ["CURVES", "MissCurves", "lru_miss_curves", "split_slots", "static_curves"]
