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

Memory: the routing (``Routes``, compact) and, per policy, its state (slots and heats per layer) plus
temporaries for a chunk of ubatches (``CHUNK_TOKENS``); nothing grows with the trace. Speed: static is one
vectorised pass; lru replays one-token ubatches (a trace file's) token by token with all layers at once in
numpy, and larger ubatches slot by slot as the engine does; belady runs per layer in Python over numpy's
next-use positions. Every policy takes ``progress(done, total)`` and ``chunk_tokens`` (the results do not
depend on it).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from ..cache_sim import MAX_UBATCH
from .ranking import CHUNK_TOKENS, prefill_resident
from .routes import Routes

Progress = Callable[[int, int], None]

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


def _columns(looked: list[int], n_layers: int) -> slice | list[int]:
    """An index for the looked-up layers' columns: a slice (a view, no copy) when they are all of them."""
    return slice(None) if looked == list(range(n_layers)) else looked


def _ubatch_chunks(routes: Routes, chunk_tokens: int = CHUNK_TOKENS) -> Iterator[tuple[int, int]]:
    """Ubatch ranges [u0, u1) of about ``chunk_tokens`` tokens each (at least one ubatch)."""
    n_ub = len(routes.starts) - 1
    chunk_tokens = max(1, chunk_tokens)
    if routes.one_token_ubatches:
        for u0 in range(0, n_ub, chunk_tokens):
            yield u0, min(u0 + chunk_tokens, n_ub)
        return
    u0 = 0
    while u0 < n_ub:
        u1 = max(u0 + 1, int(np.searchsorted(routes.starts, routes.starts[u0] + chunk_tokens, side="right")) - 1)
        yield u0, min(u1, n_ub)
        u0 = u1


def _too_big(routes: Routes, looked: list[int]) -> int:
    """(ubatch, layer) pairs of over 32 tokens: llama.cpp's path, no lookup."""
    if routes.one_token_ubatches:
        return 0
    return int((routes.layer_tokens[:, looked] > MAX_UBATCH).sum())


def static(routes: Routes, slots: dict[int, int], n_expert: int, profile: Sequence[tuple[int, int]],
           progress: Progress | None = None, chunk_tokens: int = CHUNK_TOKENS) -> PolicyResult:
    """The hybrid without adaptation: the engine's fill from the profile, then nothing moves. Counts exactly
    like the engine's hybrid counters (n_hit, n_hit_profile = n_hit, n_miss, per layer). Vectorised: the
    residency never changes; a chunk of ubatches at a time."""
    looked = _looked_up(routes, slots, n_expert)
    cols = _columns(looked, len(routes.layers))
    layers = [routes.layers[j] for j in looked]
    filled = prefill_resident(profile, slots, n_expert)
    # the last column stays False, so that the -1 padding never hits
    resident = np.zeros((len(looked), n_expert + 1), dtype=bool)
    for i, il in enumerate(layers):
        resident[i, filled[il]] = True
    jj = np.arange(len(looked))[None, :, None]
    hits = np.zeros(len(looked), dtype=np.int64)
    misses = np.zeros(len(looked), dtype=np.int64)
    n_tokens = n_all_in = 0
    n_ub = len(routes.starts) - 1
    for u0, u1 in _ubatch_chunks(routes, chunk_tokens):
        a, b = int(routes.starts[u0]), int(routes.starts[u1])
        counted = routes.counted[u0:u1][:, cols]
        d = routes.distinct[u0:u1][:, cols]
        held = resident[jj, d]
        hits += (held & counted[:, :, None]).sum(axis=(0, 2))
        misses += ((d >= 0) & ~held & counted[:, :, None]).sum(axis=(0, 2))
        tokens = counted[routes.ubatch_of_token[a:b] - u0] & routes.computed[a:b][:, cols]
        n_tokens += int(tokens.sum())
        n_all_in += int((resident[jj, routes.experts[a:b][:, cols]].all(axis=-1) & tokens).sum())
        if progress:
            progress(u1, n_ub)
    return PolicyResult("static", int(hits.sum()), int(hits.sum()), int(misses.sum()), n_tokens, n_all_in,
                        _too_big(routes, looked), sum(slots[il] for il in layers), int(resident.sum()),
                        {il: (int(h), int(m)) for il, h, m in zip(layers, hits, misses)})


def lru(routes: Routes, slots: dict[int, int], n_expert: int, profile: Sequence[tuple[int, int]] = (),
        progress: Progress | None = None, chunk_tokens: int = 1024) -> PolicyResult:
    """The upload mode, slot for slot as the engine runs it (victims by slot order on ties), from the
    engine's fill of the profile. One-token ubatches (a trace file's) are replayed with every layer at once
    (``_lru_tokens``, the same counts); larger ones slot by slot."""
    if routes.one_token_ubatches:
        return _lru_tokens(routes, slots, n_expert, profile, progress, chunk_tokens)
    return _lru_loop(routes, slots, n_expert, profile, progress)


def _lru_loop(routes: Routes, slots: dict[int, int], n_expert: int, profile: Sequence[tuple[int, int]],
              progress: Progress | None = None) -> PolicyResult:
    """``lru`` slot by slot, layer by layer, ubatch by ubatch: llama_moe_cache::lookup in Python."""
    looked = _looked_up(routes, slots, n_expert)
    filled = prefill_resident(profile, slots, n_expert)
    hits = hits_profile = misses = refused = token_layers = all_in = n_resident = 0
    per_layer: dict[int, tuple[int, int]] = {}
    bounds = list(zip(routes.starts[:-1].tolist(), routes.starts[1:].tolist()))
    for done, j in enumerate(looked):
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
        if progress:
            progress(done + 1, len(looked))
    return PolicyResult("lru", hits, hits_profile, misses, token_layers, all_in, refused,
                        sum(slots[routes.layers[j]] for j in looked), n_resident, per_layer)


def _lru_tokens(routes: Routes, slots: dict[int, int], n_expert: int, profile: Sequence[tuple[int, int]],
                progress: Progress | None, chunk_tokens: int) -> PolicyResult:
    """``lru`` for one-token ubatches, every layer at once: per token, the hits of all layers in one lookup,
    then each layer's misses into its slots in key order, key = (occupied, last use, slot) among the slots
    the token does not use: exactly the victims the slot-by-slot loop picks one after another (each victim
    it takes is then used by the token and drops out). A token's lookup is refused in a layer whose slots
    are fewer than k. An id repeated within a token counts once, as in the loop."""
    looked = _looked_up(routes, slots, n_expert)
    cols = _columns(looked, len(routes.layers))
    layers = [routes.layers[j] for j in looked]
    n_l, k = len(looked), routes.k
    filled = prefill_resident(profile, slots, n_expert)
    n_slots = np.array([slots[il] for il in layers], dtype=np.int64)
    width = int(n_slots.max()) if n_l else 1
    expert_in = np.full((n_l, width), -1, dtype=np.int64)
    slot_of = np.full((n_l, n_expert + 1), -1, dtype=np.int64)  # the last column: the -1 of an uncomputed token
    last_use = np.zeros((n_l, width), dtype=np.int64)
    from_profile = np.zeros((n_l, width), dtype=bool)
    for i, il in enumerate(layers):
        f = filled[il]
        expert_in[i, :len(f)], slot_of[i, f], from_profile[i, :len(f)] = f, np.arange(len(f)), True
    slot_no = np.arange(width, dtype=np.int64)
    never = np.iinfo(np.int64).max
    absent = slot_no[None, :] >= n_slots[:, None]  # slots a layer with fewer than the most does not have
    fits = k <= n_slots  # else every lookup in the layer is refused: its slots cannot take a token's k experts
    rows = np.arange(n_l)[:, None]
    later = np.tril(np.ones((k, k), dtype=bool), -1)  # [i, j]: position j comes before position i
    hits = np.zeros(n_l, dtype=np.int64)
    misses = np.zeros(n_l, dtype=np.int64)
    hits_profile = token_layers = all_in = refused = 0
    n = routes.n_tokens
    chunk_tokens = max(1, chunk_tokens)
    for a in range(0, n, chunk_tokens):  # the ids of a chunk of tokens converted and checked for repeats at once
        b = min(a + chunk_tokens, n)
        ids = routes.experts[a:b][:, cols].astype(np.int64)  # [tokens, layers, k]
        active = routes.computed[a:b][:, cols]
        refused += int((active & ~fits).sum())
        active = active & fits
        token_layers += int(active.sum())
        repeats = (ids[:, :, :, None] == ids[:, :, None, :]) & later
        repeated = repeats.any(axis=3) if repeats.any() else None
        for t in range(b - a):
            act = active[t]
            if not act.any():
                continue
            stamp = a + t + 1  # increases token by token: the order the engine's per-layer stamps keep
            e = ids[t]
            s = slot_of[rows, e]
            res = s >= 0
            all_in += int((res.all(axis=1) & act).sum())
            asked = act[:, None] if repeated is None else act[:, None] & ~repeated[t]
            hit = res & asked
            miss = ~res & asked
            hr, hc = np.nonzero(hit)
            if hr.size:
                hs = s[hr, hc]
                hits_profile += int(from_profile[hr, hs].sum())
                last_use[hr, hs] = stamp
                hits += np.bincount(hr, minlength=n_l)
            mr, mc = np.nonzero(miss)
            if not mr.size:
                continue
            m = np.bincount(mr, minlength=n_l)
            misses += m
            lr = np.flatnonzero(m)  # the layers that miss
            lu = last_use[lr]
            key = np.where(expert_in[lr] < 0, slot_no - width, lu * width + slot_no)  # free first, then LRU
            key[(lu == stamp) | absent[lr]] = never
            most = int(m[lr].max())
            if most < width:
                part = np.argpartition(key, most - 1, axis=1)[:, :most]
                order = np.take_along_axis(part, np.argsort(np.take_along_axis(key, part, 1), axis=1), 1)
            else:
                order = np.argsort(key, axis=1)
            which = np.searchsorted(lr, mr)  # the row of `order` for each miss's layer
            rank = np.arange(mr.size) - (np.cumsum(m) - m)[mr]  # the r-th miss of its layer takes its r-th victim
            victim = order[which, rank]
            old = expert_in[mr, victim]
            gone = old >= 0
            slot_of[mr[gone], old[gone]] = -1
            new = e[mr, mc]
            expert_in[mr, victim], slot_of[mr, new] = new, victim
            from_profile[mr, victim], last_use[mr, victim] = False, stamp
        if progress:
            progress(b, n)
    return PolicyResult("lru", int(hits.sum()), hits_profile, int(misses.sum()), token_layers, all_in, refused,
                        int(n_slots.sum()), int((expert_in >= 0).sum()),
                        {il: (int(h), int(m)) for il, h, m in zip(layers, hits, misses)})


def adaptive(routes: Routes, slots: dict[int, int], n_expert: int, profile: Sequence[tuple[int, int]] = (),
             half_life: float = HALF_LIFE_TOKENS, swap_every: int = SWAP_EVERY, max_swaps: int = MAX_SWAPS,
             fill_every: int = FILL_EVERY, max_fills: int = MAX_FILLS,
             progress: Progress | None = None, chunk_tokens: int = CHUNK_TOKENS) -> PolicyResult:
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
    cols = _columns(looked, len(routes.layers))
    n_ub = len(routes.starts) - 1
    for u0, u1 in _ubatch_chunks(routes, chunk_tokens):  # a chunk's arrays at a time: bounded temporaries
        t0 = int(routes.starts[u0])
        counted = routes.counted[u0:u1][:, cols]
        distinct = routes.distinct[u0:u1][:, cols]
        computed = routes.computed[t0:int(routes.starts[u1])][:, cols]
        experts = routes.experts[t0:int(routes.starts[u1])][:, cols]
        starts = (routes.starts[u0:u1 + 1] - t0).tolist()
        sizes = np.diff(starts).tolist()
        for i in np.flatnonzero(counted.any(axis=1)).tolist():
            c = counted[i]
            d = np.where(c[:, None], distinct[i], -1)  # the layers that did not look up select nothing
            held = resident[jj, d]
            hits += held.sum(axis=1)
            misses += ((d >= 0) & ~held).sum(axis=1)
            hits_profile += int((held & from_profile[jj, d]).sum())
            a, b = starts[i], starts[i + 1]
            tokens = c[None, :] & computed[a:b]
            token_layers += int(tokens.sum())
            all_in += int((resident[jj[None], experts[a:b]].all(axis=-1) & tokens).sum())
            n = sizes[i] if sizes[i] <= MAX_UBATCH else 0
            heat *= fade ** n
            heat[jj, d] += 1.0
            heat[:, n_expert] = 0.0
            before, generated = generated, generated + n
            if generated // fill_every > before // fill_every:
                n_fill += _fill(resident, from_profile, heat, cap, n_expert, max_fills)
            if generated // swap_every > before // swap_every:
                n_swap += _swap(resident, from_profile, heat, n_expert, max_swaps)
        if progress:
            progress(u1, n_ub)
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


def belady(routes: Routes, slots: dict[int, int], n_expert: int, progress: Progress | None = None,
           chunk_tokens: int = CHUNK_TOKENS) -> PolicyResult:
    """The ceiling: per layer, Belady's rule with bypass over the lookups' distinct experts. On a miss with
    the slots full, the expert needed furthest in the future (the newcomer included: then it is not
    admitted) leaves. Each layer starts holding the experts it will need first, as a perfect profile would.
    No policy that loads an expert when it is selected (lru, static) can hit more; one that loads ahead of
    selection (adaptive's swaps) could pass it, by at most one hit per expert it loads. Knowing the future
    takes a layer's lookups at once: its ids and each one's next use (numpy, 5 bytes per id of the layer at
    int8 ids), replayed a chunk at a time."""
    looked = _looked_up(routes, slots, n_expert)
    hits = misses = token_layers = all_in = n_resident = 0
    per_layer: dict[int, tuple[int, int]] = {}
    one_token = routes.one_token_ubatches
    for done, j in enumerate(looked):
        il, n = routes.layers[j], slots[routes.layers[j]]
        lookups = np.flatnonzero(routes.counted[:, j])
        d = routes.distinct[lookups, j]
        valid = d >= 0
        flat = d[valid]  # the layer's lookups one after another
        pos_type = np.int32 if flat.size < np.iinfo(np.int32).max else np.int64
        never = int(np.iinfo(pos_type).max)
        next_use, first_pos = _next_uses(flat, n_expert, never, pos_type, chunk_tokens * routes.k)
        seen = np.flatnonzero(first_pos != never)
        soonest = seen[np.argsort(first_pos[seen], kind="stable")[:n]]  # the experts needed first, soonest first
        when = dict(zip(soonest.tolist(), first_pos[soonest].tolist()))  # resident expert -> its next use
        heap = [(-pos, e) for e, pos in when.items()]  # (-next use, expert): the one needed last on top
        heapq.heapify(heap)
        push, pop = heapq.heappush, heapq.heappop
        ends = np.concatenate(([0], np.cumsum(valid.sum(axis=1))))
        del valid
        lh = lm = 0
        step = max(1, chunk_tokens)
        for c0 in range(0, len(lookups), step):  # Python lists for a chunk of lookups at a time
            c1 = min(c0 + step, len(lookups))
            p0, p1 = int(ends[c0]), int(ends[c1])
            ids_c, uses_c = flat[p0:p1].tolist(), next_use[p0:p1].tolist()
            bounds = (ends[c0:c1 + 1] - p0).tolist()
            for s, (a, b) in enumerate(zip(bounds[:-1], bounds[1:])):
                if one_token:  # the step is the token's row: all resident before it <=> all of it hits
                    token_layers += 1
                else:
                    u = int(lookups[c0 + s])
                    for row in routes.experts[routes.starts[u]:routes.starts[u + 1], j].tolist():
                        if row[0] >= 0:
                            token_layers += 1
                            all_in += all(e in when for e in row)
                h = 0
                for e, nu in zip(ids_c[a:b], uses_c[a:b]):
                    if e in when:
                        h += 1
                    elif len(when) >= n:
                        while when.get(heap[0][1]) != -heap[0][0]:  # entries a later use has replaced
                            pop(heap)
                        if -heap[0][0] <= nu:  # the newcomer is needed last: bypass it
                            continue
                        del when[pop(heap)[1]]
                    when[e] = nu
                    push(heap, (-nu, e))
                lh += h
                lm += b - a - h
                if one_token:
                    all_in += h == b - a
                if len(heap) > 4 * n + 64:  # drop the replaced entries: the heap stays O(slots)
                    heap = [(-pos, e) for e, pos in when.items()]
                    heapq.heapify(heap)
        hits, misses = hits + lh, misses + lm
        per_layer[il] = (lh, lm)
        n_resident += len(when)
        if progress:
            progress(done + 1, len(looked))
    return PolicyResult("belady", hits, 0, misses, token_layers, all_in, _too_big(routes, looked),
                        sum(slots[routes.layers[j]] for j in looked), n_resident, per_layer)


def _next_uses(flat: np.ndarray, n_expert: int, never: int, pos_type: type, chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """(next use of every position: the next position holding the same expert, or ``never``; each expert's
    first position, or ``never``), computed a chunk at a time from the end: temporaries of a chunk."""
    next_use = np.empty(flat.size, dtype=pos_type)
    after = np.full(n_expert + 1, never, dtype=pos_type)  # each expert's first position past the chunk
    chunk = max(1, chunk)
    for b in range(flat.size, 0, -chunk):
        a = max(0, b - chunk)
        f = flat[a:b]
        order = np.argsort(f, kind="stable")
        fs = f[order]
        same = fs[1:] == fs[:-1]
        nu = np.empty(b - a, dtype=pos_type)
        nu[order] = after[fs]  # by default the expert's next position past the chunk ...
        nu[order[:-1][same]] = order[1:][same] + a  # ... unless it comes again within it
        next_use[a:b] = nu
        first = np.concatenate(([True], ~same))
        after[fs[first]] = order[first] + a
    return next_use, after[:n_expert]


POLICIES = ("lru", "static", "adaptive", "belady")


def run_policy(name: str, routes: Routes, slots: dict[int, int], n_expert: int,
               profile: Sequence[tuple[int, int]], progress: Progress | None = None) -> PolicyResult:
    """One of POLICIES by name; the profile fills lru, static and adaptive at the start (belady needs none).
    ``progress(done, total)`` as the replay goes."""
    if name == "lru":
        return lru(routes, slots, n_expert, profile, progress)
    if name == "static":
        return static(routes, slots, n_expert, profile, progress)
    if name == "adaptive":
        return adaptive(routes, slots, n_expert, profile, progress=progress)
    if name == "belady":
        return belady(routes, slots, n_expert, progress)
    raise ValueError(f"unknown policy {name!r}; one of {', '.join(POLICIES)}")
