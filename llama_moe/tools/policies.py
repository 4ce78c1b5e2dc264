"""Cache policies replayed over routing, counting like the engine: per layer, hits and misses of the
distinct experts of each ubatch of up to 32 tokens; layers held whole need no lookups and are not counted.

- ``lru``: the upload mode (llama_moe_cache::lookup): a miss is uploaded into a free slot, else the least
  recently used slot the ubatch does not use; a ubatch with more experts than slots is refused (not looked
  up). It counts like ``cache_sim.simulate_lru`` and adds h_layer.
- ``static``: the hybrid without adaptation (count_hybrid): the profile's experts stay, the others run on
  the CPU.
- ``adaptive``: the hybrid that swaps hot experts in (the reference's "adaptive cache" and its constants).
- ``belady``: per layer, the most hits a cache of that size could have, knowing the future (the ceiling).

Every policy also reports h_layer: the share of looked-up (layer, token) pairs whose k experts were all
resident when the ubatch was looked up (the tokens that need no CPU or upload work in that layer).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..cache_sim import MAX_UBATCH
from .ranking import prefill_resident
from .routes import Routes

# the adaptive cache's constants (reference.md, "The adaptive cache")
HALF_LIFE_TOKENS = 350   # heats halve over this many generated tokens
SWAP_EVERY = 32          # a round of swaps every this many generated tokens
MAX_SWAPS = 64           # experts swapped in per round, over all layers
SWAP_RATIO = 1.5         # an expert comes in only when heat(in) > SWAP_RATIO * heat(out) + SWAP_MARGIN
SWAP_MARGIN = 2.0
FILL_EVERY = 8           # free slots are filled every this many generated tokens,
MAX_FILLS = 128          # at most this many at a time


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    n_hit: int
    n_hit_profile: int      # hits on experts the profile put there and that stayed since
    n_miss: int
    n_token_layers: int     # (layer, token) pairs looked up
    n_token_layers_all: int  # of them, with all k experts resident: h_layer's numerator
    n_refused: int          # (ubatch, layer) lookups not made: over 32 tokens, or (upload) more experts than slots
    n_slots: int            # slots of the layers looked up
    n_resident: int         # of them, holding an expert at the end: a cache that never fills caps the hit rate
    per_layer: dict[int, tuple[int, int]] = field(default_factory=dict)  # il -> (hits, misses)
    n_swap: int = 0         # adaptive: experts swapped in for colder ones
    n_fill: int = 0         # adaptive: free slots filled

    @property
    def n_lookup(self) -> int:
        return self.n_hit + self.n_miss

    @property
    def hit_rate(self) -> float:
        """hits / lookups; 1.0 when every layer is held whole (no lookups, everything resident)."""
        return self.n_hit / self.n_lookup if self.n_lookup else 1.0

    @property
    def h_layer(self) -> float:
        return self.n_token_layers_all / self.n_token_layers if self.n_token_layers else 1.0

    def layer_hit_rate(self, il: int) -> float:
        h, m = self.per_layer.get(il, (0, 0))
        return h / (h + m) if h + m else 1.0


def merge_results(results: Sequence[PolicyResult]) -> PolicyResult:
    """Pools the counts of several replays (the folds of a k-fold): hits over lookups of all of them."""
    per_layer: dict[int, tuple[int, int]] = {}
    for r in results:
        for il, (h, m) in r.per_layer.items():
            ph, pm = per_layer.get(il, (0, 0))
            per_layer[il] = (ph + h, pm + m)
    sums = {name: sum(getattr(r, name) for r in results) for name in
            ("n_hit", "n_hit_profile", "n_miss", "n_token_layers", "n_token_layers_all", "n_refused", "n_slots",
             "n_resident", "n_swap", "n_fill")}
    return PolicyResult(results[0].policy, per_layer=per_layer, **sums)


def _looked_up(routes: Routes, slots: dict[int, int], n_expert: int) -> list[int]:
    """Indices into routes.layers of the layers the cache looks up: cached, and not held whole."""
    return [j for j, il in enumerate(routes.layers) if il in slots and slots[il] < n_expert]


def _too_big(routes: Routes, looked: list[int]) -> int:
    """(ubatch, layer) pairs of over 32 tokens: llama.cpp's path, no lookup."""
    return int((routes.layer_tokens[:, looked] > MAX_UBATCH).sum())


def static(routes: Routes, slots: dict[int, int], n_expert: int, profile: Sequence[tuple[int, int]]) -> PolicyResult:
    """The hybrid without adaptation: the engine's fill from the profile, then nothing moves. Counts exactly
    like the engine's hybrid counters (n_hit, n_hit_profile = n_hit, n_miss, per layer). Vectorised: the
    residency never changes."""
    looked = _looked_up(routes, slots, n_expert)
    layers = [routes.layers[j] for j in looked]
    filled = prefill_resident(profile, slots, n_expert)
    # the last column stays False, so that the -1 padding never hits
    resident = np.zeros((len(looked), n_expert + 1), dtype=bool)
    for i, il in enumerate(layers):
        resident[i, filled[il]] = True
    jj = np.arange(len(looked))[None, :, None]
    counted = routes.counted[:, looked]
    d = routes.distinct[:, looked]
    held = resident[jj, d]
    hits = (held & counted[:, :, None]).sum(axis=(0, 2))
    misses = ((d >= 0) & ~held & counted[:, :, None]).sum(axis=(0, 2))
    tokens = counted[routes.ubatch_of_token] & routes.computed[:, looked]
    all_in = resident[jj, routes.experts[:, looked]].all(axis=-1) & tokens
    return PolicyResult("static", int(hits.sum()), int(hits.sum()), int(misses.sum()), int(tokens.sum()),
                        int(all_in.sum()), _too_big(routes, looked), sum(slots[il] for il in layers),
                        int(resident.sum()), {il: (int(h), int(m)) for il, h, m in zip(layers, hits, misses)})


def lru(routes: Routes, slots: dict[int, int], n_expert: int, profile: Sequence[tuple[int, int]] = ()) -> PolicyResult:
    """The upload mode, slot for slot as the engine runs it (victims by slot order on ties), from the
    engine's fill of the profile."""
    looked = _looked_up(routes, slots, n_expert)
    filled = prefill_resident(profile, slots, n_expert)
    hits = hits_profile = misses = refused = token_layers = all_in = n_resident = 0
    per_layer: dict[int, tuple[int, int]] = {}
    bounds = list(zip(routes.starts[:-1].tolist(), routes.starts[1:].tolist()))
    for j in looked:
        il = routes.layers[j]
        n = slots[il]
        expert_in = filled[il] + [-1] * (n - len(filled[il]))
        slot_of = {e: s for s, e in enumerate(filled[il])}
        last_use = [0] * n
        from_profile = [e >= 0 for e in expert_in]
        counted, n_tokens = routes.counted[:, j].tolist(), routes.layer_tokens[:, j].tolist()
        stamp = lh = lm = 0
        for u, (a, b) in enumerate(bounds):
            if not n_tokens[u]:
                continue
            # the engine looks up only ubatches whose experts all fit the slots at once
            if not counted[u] or n_tokens[u] * routes.k > n:
                refused += 1
                continue
            stamp += 1
            rows = [row for row in routes.experts[a:b, j].tolist() if row[0] >= 0]
            for row in rows:  # h_layer: resident before this ubatch's uploads
                all_in += all(e in slot_of for e in row)
            token_layers += len(rows)
            ids = [e for row in rows for e in row]
            for e in ids:  # hits first, distinct per ubatch
                s = slot_of.get(e, -1)
                if s >= 0 and last_use[s] != stamp:
                    last_use[s] = stamp
                    lh += 1
                    hits_profile += from_profile[s]
            for e in ids:
                if e in slot_of:
                    continue
                victim = -1
                for c in range(n):  # a free slot, else the least recently used one this ubatch does not use
                    if expert_in[c] < 0:
                        victim = c
                        break
                    if last_use[c] != stamp and (victim < 0 or last_use[c] < last_use[victim]):
                        victim = c
                if expert_in[victim] >= 0:
                    del slot_of[expert_in[victim]]
                expert_in[victim], slot_of[e], from_profile[victim], last_use[victim] = e, victim, False, stamp
                lm += 1
        hits, misses = hits + lh, misses + lm
        per_layer[il] = (lh, lm)
        n_resident += len(slot_of)
    return PolicyResult("lru", hits, hits_profile, misses, token_layers, all_in, refused,
                        sum(slots[routes.layers[j]] for j in looked), n_resident, per_layer)


def adaptive(routes: Routes, slots: dict[int, int], n_expert: int, profile: Sequence[tuple[int, int]] = (),
             half_life: float = HALF_LIFE_TOKENS, swap_every: int = SWAP_EVERY, max_swaps: int = MAX_SWAPS,
             fill_every: int = FILL_EVERY, max_fills: int = MAX_FILLS) -> PolicyResult:
    """The adaptive hybrid: counts like ``static``, and follows the text. Each lookup adds 1 to the heat of
    each (layer, expert) it selected (distinct per ubatch); all heats fade by 0.5**(1/half_life) per
    generated token (a ubatch of up to 32 tokens counts its tokens; a larger one, a prompt, does not move
    the clock). Once the generated tokens pass a multiple of ``fill_every``, free slots take the hottest
    experts not held (heat > 0), up to ``max_fills``; past a multiple of ``swap_every``, the hottest missing
    experts of all layers replace their own layer's coldest resident ones, hottest first, while
    heat(in) > 1.5 heat(out) + 2, at most ``max_swaps``. Changes apply from the next ubatch (the engine
    swaps between tokens)."""
    looked = _looked_up(routes, slots, n_expert)
    filled = prefill_resident(profile, slots, n_expert)
    layers = [routes.layers[j] for j in looked]
    cap = np.array([slots[il] for il in layers], dtype=np.int64)
    resident = np.zeros((len(looked), n_expert + 1), dtype=bool)  # the last column takes the -1 padding
    for i, il in enumerate(layers):
        resident[i, filled[il]] = True
    from_profile = resident.copy()
    heat = np.zeros((len(looked), n_expert + 1))
    fade = 0.5 ** (1.0 / half_life)
    jj = np.arange(len(looked))[:, None]
    hits = np.zeros(len(looked), dtype=np.int64)
    misses = np.zeros(len(looked), dtype=np.int64)
    hits_profile = token_layers = all_in = n_swap = n_fill = generated = 0
    distinct, counted, computed = routes.distinct[:, looked], routes.counted[:, looked], routes.computed[:, looked]
    sizes = routes.ubatch_sizes.tolist()
    for u in np.nonzero(counted.any(axis=1))[0].tolist():
        c = counted[u]
        d = np.where(c[:, None], distinct[u], -1)  # the layers that did not look up select nothing
        held = resident[jj, d]
        hits += held.sum(axis=1)
        misses += ((d >= 0) & ~held).sum(axis=1)
        hits_profile += int((held & from_profile[jj, d]).sum())
        a, b = routes.starts[u], routes.starts[u + 1]
        tokens = c[None, :] & computed[a:b]
        token_layers += int(tokens.sum())
        all_in += int((resident[jj[None], routes.experts[a:b][:, looked]].all(axis=-1) & tokens).sum())
        n = sizes[u] if sizes[u] <= MAX_UBATCH else 0
        heat *= fade ** n
        heat[jj, d] += 1.0
        heat[:, n_expert] = 0.0
        before, generated = generated, generated + n
        if generated // fill_every > before // fill_every:
            n_fill += _fill(resident, from_profile, heat, cap, n_expert, max_fills)
        if generated // swap_every > before // swap_every:
            n_swap += _swap(resident, from_profile, heat, n_expert, max_swaps)
    return PolicyResult("adaptive", int(hits.sum()), hits_profile, int(misses.sum()), token_layers, all_in,
                        _too_big(routes, looked), int(cap.sum()), int(resident.sum()),
                        {il: (int(h), int(m)) for il, h, m in zip(layers, hits, misses)}, n_swap, n_fill)


def _hottest_missing(resident: np.ndarray, heat: np.ndarray, n_expert: int, floor: float) -> list[tuple[int, int]]:
    """(layer index, expert) of the experts not held with heat above ``floor``, hottest first (ties: lower
    layer, then lower expert)."""
    j, e = np.nonzero(~resident[:, :n_expert] & (heat[:, :n_expert] > floor))
    order = np.lexsort((e, j, -heat[j, e]))
    return list(zip(j[order].tolist(), e[order].tolist()))


def _fill(resident: np.ndarray, from_profile: np.ndarray, heat: np.ndarray, cap: np.ndarray, n_expert: int,
          max_fills: int) -> int:
    free = cap - resident[:, :n_expert].sum(axis=1)
    if not free.any():
        return 0
    n = 0
    for j, e in _hottest_missing(resident, heat, n_expert, 0.0):
        if free[j] > 0:
            resident[j, e], from_profile[j, e] = True, False
            free[j] -= 1
            n += 1
            if n == max_fills:
                break
    return n


def _swap(resident: np.ndarray, from_profile: np.ndarray, heat: np.ndarray, n_expert: int, max_swaps: int) -> int:
    coldest: dict[int, list[int]] = {}  # layer index -> its resident experts as the round began, coldest last
    n = 0
    for j, e_in in _hottest_missing(resident, heat, n_expert, SWAP_MARGIN):  # heat(in) > 2 at the least
        if j not in coldest:
            held = np.nonzero(resident[j, :n_expert])[0]
            coldest[j] = held[np.lexsort((held, heat[j, held]))].tolist()[::-1]
        if not coldest[j]:
            continue
        e_out = coldest[j][-1]
        if heat[j, e_in] > SWAP_RATIO * heat[j, e_out] + SWAP_MARGIN:
            coldest[j].pop()
            resident[j, e_out], resident[j, e_in] = False, True
            from_profile[j, e_out] = from_profile[j, e_in] = False
            n += 1
            if n == max_swaps:
                break
    return n


def belady(routes: Routes, slots: dict[int, int], n_expert: int) -> PolicyResult:
    """The ceiling: per layer, Belady's rule with bypass over the lookups' distinct experts. On a miss with
    the slots full, the expert needed furthest in the future (the newcomer included: then it is not
    admitted) leaves. Each layer starts holding the experts it will need first, as a perfect profile would.
    No policy that loads an expert when it is selected (lru, static) can hit more; one that loads ahead of
    selection (adaptive's swaps) could pass it, by at most one hit per expert it loads."""
    looked = _looked_up(routes, slots, n_expert)
    never = 1 << 62
    hits = misses = token_layers = all_in = n_resident = 0
    per_layer: dict[int, tuple[int, int]] = {}
    for j in looked:
        il, n = routes.layers[j], slots[routes.layers[j]]
        lookups = np.nonzero(routes.counted[:, j])[0].tolist()
        steps = [[e for e in routes.distinct[u, j].tolist() if e >= 0] for u in lookups]
        flat = [e for step in steps for e in step]
        next_use = [never] * len(flat)
        seen: dict[int, int] = {}
        for i in range(len(flat) - 1, -1, -1):
            next_use[i] = seen.get(flat[i], never)
            seen[flat[i]] = i
        first = sorted(seen.items(), key=lambda kv: kv[1])[:n]  # the experts needed first, soonest first
        when = dict(first)  # resident expert -> position of its next use
        heap = [(-pos, e) for e, pos in first]
        heapq.heapify(heap)
        lh = lm = i = 0
        for u, step in zip(lookups, steps):
            for row in routes.experts[routes.starts[u]:routes.starts[u + 1], j].tolist():
                if row[0] >= 0:
                    token_layers += 1
                    all_in += all(e in when for e in row)
            for e in step:
                nu = next_use[i]
                i += 1
                if e in when:
                    lh += 1
                elif len(when) < n:
                    lm += 1
                else:
                    lm += 1
                    while when.get(heap[0][1]) != -heap[0][0]:  # entries a later use has replaced
                        heapq.heappop(heap)
                    if -heap[0][0] <= nu:  # the newcomer is needed last: bypass it
                        continue
                    del when[heapq.heappop(heap)[1]]
                when[e] = nu
                heapq.heappush(heap, (-nu, e))
        hits, misses = hits + lh, misses + lm
        per_layer[il] = (lh, lm)
        n_resident += len(when)
    return PolicyResult("belady", hits, 0, misses, token_layers, all_in, _too_big(routes, looked),
                        sum(slots[routes.layers[j]] for j in looked), n_resident, per_layer)


POLICIES = ("lru", "static", "adaptive", "belady")


def run_policy(name: str, routes: Routes, slots: dict[int, int], n_expert: int,
               profile: Sequence[tuple[int, int]]) -> PolicyResult:
    """One of POLICIES by name; the profile fills lru, static and adaptive at the start (belady needs none)."""
    if name == "lru":
        return lru(routes, slots, n_expert, profile)
    if name == "static":
        return static(routes, slots, n_expert, profile)
    if name == "adaptive":
        return adaptive(routes, slots, n_expert, profile)
    if name == "belady":
        return belady(routes, slots, n_expert)
    raise ValueError(f"unknown policy {name!r}; one of {', '.join(POLICIES)}")
