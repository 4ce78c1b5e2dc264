"""Online re-partitioning of the admitting hybrid's slots between layers, in the simulator (``admitN-repartR``):
the engine sizes its layers once, at load (a profile's per-layer slots). Integer arithmetic throughout, and
every tie broken by layer and slot, so that an engine can follow it slot for slot.

Each looked-up layer keeps a shadow LRU stack of its experts (Mattson): a lookup of an expert at stack depth d
(0 = the most recent) adds one to the layer's histogram at d, then the ubatch's experts go on top; a first use
adds nothing (a cold miss at every size). With C slots an LRU would miss the lookups at depths C and deeper, so the
histogram's tail sums are the layer's miss curve. Every R decodes the slots of the looked-up layers are split
anew (``target``): each layer at least its floor (its experts per token, or fewer if it started with fewer)
and at most n_expert - 1 (a layer held whole needs no lookup and would see no more curve); the rest goes
greedily to the largest gain per slot on each curve's lower convex hull; slots no curve asks for stay where
they were. The split is applied only if it predicts at least 1/``HYSTERESIS`` fewer misses than the current
one. Every ``HALVE_ROUNDS`` rounds the histograms halve, so the curves follow a long conversation; halving every
round instead (curves of a few hundred tokens) moves slots on noise (docs/benchmarks.md).

A layer that shrinks keeps its most recently used experts (ties: the lower slot), packed into its first slots
in their slot order; one that grows gets free slots at its end, which admission fills first."""
from __future__ import annotations

from functools import cmp_to_key
from typing import Sequence

from .misscurves import lower_hull

HYSTERESIS = 32  # a new split must predict at least 1/32 fewer misses than the current one
HALVE_ROUNDS = 16  # the histograms halve every 16 rounds: they weigh the conversation so far, the recent text more


class ShadowStack:
    """A layer's shadow LRU stack and the histogram of its lookups' depths."""

    __slots__ = ("stack", "hist")

    def __init__(self, n_expert: int) -> None:
        self.stack: list[int] = []
        self.hist = [0] * n_expert

    def touch(self, experts: Sequence[int]) -> None:
        """One ubatch's distinct experts, in the order it first selected them: each one's depth is taken before
        any of them moves (they are used together and never push each other down), then they go on top, the
        last one topmost."""
        st = self.stack
        for e in experts:
            if e in st:
                self.hist[st.index(e)] += 1
        for e in experts:
            if e in st:
                st.remove(e)
            st.insert(0, e)

    def halve(self) -> None:
        self.hist = [h >> 1 for h in self.hist]


def _misses(hist: Sequence[int]) -> list[int]:
    """[C] predicted misses with C slots: the lookups at depth C or deeper (cold misses left out)."""
    out = [0] * (len(hist) + 1)
    for c in range(len(hist) - 1, -1, -1):
        out[c] = out[c + 1] + hist[c]
    return out


def target(hists: Sequence[Sequence[int]], current: Sequence[int], floors: Sequence[int],
           caps: Sequence[int]) -> list[int] | None:
    """The new slots per layer, or None to keep ``current`` (no split predicts 1/HYSTERESIS fewer misses)."""
    n = len(current)
    budget = sum(current)
    curves = [_misses(h) for h in hists]
    alloc = list(floors)
    left = budget - sum(alloc)
    if left < 0:
        return None
    segments: list[tuple[int, int, int, int]] = []  # (gain, width, layer, from)
    for j in range(n):
        pts = lower_hull(curves[j], floors[j], caps[j])
        for a, b in zip(pts[:-1], pts[1:]):
            gain = curves[j][a] - curves[j][b]
            if gain > 0:
                segments.append((gain, b - a, j, a))

    def better(x: tuple[int, int, int, int], y: tuple[int, int, int, int]) -> int:
        lhs, rhs = x[0] * y[1], y[0] * x[1]  # gain per slot, compared exactly
        if lhs != rhs:
            return -1 if lhs > rhs else 1
        return -1 if (x[2], x[3]) < (y[2], y[3]) else (1 if (x[2], x[3]) > (y[2], y[3]) else 0)

    segments.sort(key=cmp_to_key(better))
    blocked = [False] * n
    for _, width, j, a in segments:
        if left == 0:
            break
        if blocked[j] or alloc[j] != a:
            continue
        take = min(width, left)
        alloc[j] += take
        left -= take
        if take < width:
            blocked[j] = True
    for j in range(n):  # what no curve asks for stays where it was
        if left == 0:
            break
        give = min(left, max(0, current[j] - alloc[j]), caps[j] - alloc[j])
        alloc[j] += give
        left -= give
    for j in range(n):  # then anywhere there is room (a layer's old share was taken by the floors)
        if left == 0:
            break
        give = min(left, caps[j] - alloc[j])
        alloc[j] += give
        left -= give
    if alloc == list(current):
        return None
    now = sum(curves[j][current[j]] for j in range(n))
    new = sum(curves[j][alloc[j]] for j in range(n))
    if (now - new) * HYSTERESIS < now or now == new:
        return None
    return alloc


def kept_slots(expert_in: Sequence[int], last_use: Sequence[int], n_new: int) -> list[int]:
    """The slots whose experts a layer shrinking to ``n_new`` slots keeps, in slot order: the most recently
    used (ties: the lower slot)."""
    held = [s for s, e in enumerate(expert_in) if e >= 0]
    if len(held) <= n_new:
        return held
    keep = sorted(held, key=lambda s: (-last_use[s], s))[:n_new]
    return sorted(keep)


__all__ = ["HALVE_ROUNDS", "HYSTERESIS", "ShadowStack", "kept_slots", "target"]
