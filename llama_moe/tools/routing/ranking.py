"""Ranking (layer, expert) pairs from routing into an STRP profile, and the engine's fill of a cache from
a profile (llama_moe_cache::prefill), so that simulations start where the engine starts. A ranking needs
only the selections' counts per (layer, expert): from streamed trace files, one pass
(``TraceRoutes.segment_counts``), whatever their length."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from ..experts import ExpertLayout
from ...formats.profile import Profile
from .routes import JoinedRoutes, Routes
from .tracefiles import TraceRoutes


CHUNK_TOKENS = 2048  # ubatches counted (or replayed) at a time: temporaries of a few MiB at any trace size


def pair_counts(routes: Routes | JoinedRoutes | TraceRoutes, n_expert: int, chunk_tokens: int = CHUNK_TOKENS) -> np.ndarray:
    """[n_layers, n_expert]: in how many ubatches each expert was selected (distinct per ubatch, the unit
    the cache counts; a trace file's ubatches are single tokens). Counted a chunk of ubatches at a time; the
    pieces of a ``JoinedRoutes`` are counted where they are, and the sum is kept with it; trace files in one
    streaming pass (kept with the ``TraceRoutes``)."""
    if isinstance(routes, TraceRoutes):
        return routes.pair_counts(n_expert)
    if isinstance(routes, JoinedRoutes):
        if n_expert not in routes.counts_cache:
            routes.counts_cache[n_expert] = sum(pair_counts(p, n_expert, chunk_tokens) for p in routes.parts)
        return routes.counts_cache[n_expert]
    n_layers, width = len(routes.layers), n_expert + 1  # one more column takes the -1 padding
    base = (np.arange(n_layers, dtype=np.int64) * width + 1)[None, :, None]
    counts = np.zeros(n_layers * width, dtype=np.int64)
    d = routes.distinct
    for a in range(0, len(d), max(1, chunk_tokens)):
        block = d[a:a + chunk_tokens]
        counts += np.bincount((block + base).ravel(), minlength=n_layers * width)
    return counts.reshape(n_layers, width)[:, 1:]


def segment_counts(routes: Routes | TraceRoutes, edges: Sequence[int], n_expert: int,
                   progress: Callable[[int, int], None] | None = None) -> np.ndarray:
    """[len(edges) - 1, n_layers, n_expert]: ``pair_counts`` of tokens ``edges[i]:edges[i + 1]`` each (a
    ubatch cut by an edge counts its part on each side, as ``Routes.tokens`` cuts it); trace files in one
    pass."""
    if isinstance(routes, TraceRoutes):
        return routes.segment_counts(edges, n_expert, progress)
    parts = [routes if (a, b) == (0, routes.n_tokens) else routes.tokens(a, b) for a, b in zip(edges[:-1], edges[1:])]
    out = np.stack([pair_counts(p, n_expert) for p in parts])
    if progress:
        progress(1, 1)
    return out


def rank_counts(counts: np.ndarray, layers: Sequence[int]) -> tuple[tuple[int, int], ...]:
    """``rank_pairs`` from the counts: every pair counted, hottest first; ties to the lower layer, then the
    lower expert."""
    j, e = np.nonzero(counts)
    order = np.lexsort((e, j, -counts[j, e]))
    return tuple((layers[int(j[i])], int(e[i])) for i in order)


def rank_pairs(routes: Routes | JoinedRoutes | TraceRoutes, n_expert: int) -> tuple[tuple[int, int], ...]:
    """Every (layer, expert) pair the routing selected, hottest first over all layers; ties go to the lower
    layer, then the lower expert, so a profile is reproducible."""
    return rank_counts(pair_counts(routes, n_expert), routes.layers)


def make_profile(routes: Routes | TraceRoutes, layout: ExpertLayout, slots: int = 0) -> Profile:
    """A profile of every selected pair, hottest first: the engine fills each layer with its own first pairs,
    as many as it has slots, so one profile serves any cache size. ``slots`` is informational."""
    return Profile(layout.n_layer, layout.n_expert, slots, rank_pairs(routes, layout.n_expert))


def prefill_resident(pairs: Sequence[tuple[int, int]], slots: dict[int, int], n_expert: int) -> dict[int, list[int]]:
    """What the engine's fill leaves in each layer's slots, in slot order, asked of the engine (its policy's
    prefill, ``llama_moe.policy_replay``): each layer's own pairs in rank order until its slots are full; layers
    held whole are not filled from the profile (they hold everything already) and are left out."""
    from ...policy_replay import LayerShape, PolicyReplay, ReplayPolicy

    looked = [il for il, n in slots.items() if n < n_expert]
    if not looked:
        return {}
    shapes = [LayerShape(il, n_expert, 1, 1) for il in looked]
    with PolicyReplay(shapes, {il: slots[il] for il in looked}, ReplayPolicy("hybrid", ranked=tuple(pairs))) as replay:
        return {il: [e for e in replay.slots(il) if e >= 0] for il in looked}
