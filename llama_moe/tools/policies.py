"""Cache policies replayed over routing, counting like the engine: per layer, hits, misses and refused of the
distinct experts of each ubatch of up to 32 tokens; layers held whole need no lookups and are not counted.

- ``lru``: the upload mode (llama_moe_cache::lookup): a miss is uploaded into a free slot, else the least
  recently used slot the ubatch does not use; a ubatch whose tokens x k exceed the layer's slots is refused,
  as the engine refuses it (its graph is built before the router picks): its distinct experts count as
  refused and the slots stay as they were. It counts like ``cache_sim.simulate_lru`` and adds h_layer.
- ``static``: the hybrid without adaptation (count_hybrid): the profile's experts stay, the others run on
  the CPU.
- ``adaptive``: the hybrid that swaps hot experts in (the reference's "adaptive cache" and its constants).
- ``belady``: per layer, the most hits a cache of that size could have, knowing the future (the ceiling).

Every policy also reports h_layer: the share of looked-up or refused (layer, token) pairs whose k experts were
all resident when the ubatch was looked up (the tokens that need no CPU or upload work in that layer; a refused
pair never is).

The hit rate is hits / (hits + misses + refused): a refused lookup is in the denominator, so that a cache too
small for its ubatches (upload mode at fewer slots than k) scores 0, not 1. With nothing looked up at all
(every layer held whole) there is no hit rate: ``hit_rate``, ``h_layer`` and ``layer_hit_rate`` are None, and
the reports print "n/a".

Every policy but belady is a ``Replay``: a state fed the routing a chunk of whole ubatches at a time, in
order, from a ``Routes`` in memory or from trace files as they are read (``TraceRoutes``); its memory is
its state (slots and heats per layer) and the temporaries of a chunk, whatever the routing's length, and
``replay_jobs`` feeds many of them (sizes, policies, folds) from one pass over the files. Belady needs the
future: it holds a layer's ids and their next uses (5 bytes per id of the layer), and reads trace files
once per group of layers. Speed: static is vectorised over a chunk; lru replays one-token ubatches (a trace
file's) token by token with all layers at once in numpy, and larger ubatches slot by slot as the engine
does; belady runs per layer in Python over numpy's next-use positions. Every policy takes ``progress(done,
total)`` and ``chunk_tokens`` (the results do not depend on it).
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from ..cache_sim import MAX_UBATCH
from .ranking import CHUNK_TOKENS, prefill_resident
from .routes import Routes
from .tracefiles import TraceRoutes

Progress = Callable[[int, int], None]

# the adaptive cache's constants (reference.md, "The adaptive cache")
HALF_LIFE_TOKENS = 350   # heats halve over this many generated tokens
SWAP_EVERY = 32          # a round of swaps every this many generated tokens
MAX_SWAPS = 64           # experts swapped in per round, over all layers
SWAP_RATIO = 1.5         # an expert comes in only when heat(in) > SWAP_RATIO * heat(out) + SWAP_MARGIN
SWAP_MARGIN = 2.0
PRIOR_TOKENS = 64.0      # a profile's expert starts as hot as its share (k / slots) of this many tokens' picks
FILL_EVERY = 8           # free slots are filled every this many generated tokens,
MAX_FILLS = 128          # at most this many at a time


@dataclass(frozen=True)
class PolicyResult:
    policy: str
    n_hit: int
    n_hit_profile: int      # hits on experts the profile put there and that stayed since
    n_miss: int
    n_token_layers: int     # (layer, token) pairs looked up or refused: h_layer's denominator
    n_token_layers_all: int  # of them, with all k experts resident: h_layer's numerator
    n_refused: int          # (upload) selections of the lookups refused: distinct experts of a ubatch whose
                            # tokens x k exceed the layer's slots, as the engine's n_refused
    n_slots: int            # slots of the layers looked up
    n_resident: int         # of them, holding an expert at the end: a cache that never fills caps the hit rate
    per_layer: dict[int, tuple[int, int]] = field(default_factory=dict)  # il -> (hits, misses)
    n_swap: int = 0         # adaptive: experts swapped in for colder ones
    n_fill: int = 0         # adaptive: free slots filled
    per_layer_refused: dict[int, int] = field(default_factory=dict)  # il -> refused selections
    n_refused_lookups: int = 0  # (ubatch, layer) lookups refused
    n_large: int = 0        # (ubatch, layer) pairs of over 32 tokens: llama.cpp's path, neither looked up nor refused

    @property
    def n_lookup(self) -> int:
        """hits + misses + refused: the selections the cache was asked for."""
        return self.n_hit + self.n_miss + self.n_refused

    @property
    def hit_rate(self) -> float | None:
        """hits / (hits + misses + refused); None when nothing was looked up (every layer held whole)."""
        return self.n_hit / self.n_lookup if self.n_lookup else None

    @property
    def h_layer(self) -> float | None:
        return self.n_token_layers_all / self.n_token_layers if self.n_token_layers else None

    def layer_hit_rate(self, il: int) -> float | None:
        h, m = self.per_layer.get(il, (0, 0))
        n = h + m + self.per_layer_refused.get(il, 0)
        return h / n if n else None


def merge_results(results: Sequence[PolicyResult]) -> PolicyResult:
    """Pools the counts of several replays (the folds of a k-fold): hits over lookups of all of them."""
    per_layer: dict[int, tuple[int, int]] = {}
    per_layer_refused: dict[int, int] = {}
    for r in results:
        for il, (h, m) in r.per_layer.items():
            ph, pm = per_layer.get(il, (0, 0))
            per_layer[il] = (ph + h, pm + m)
        for il, n in r.per_layer_refused.items():
            per_layer_refused[il] = per_layer_refused.get(il, 0) + n
    sums = {name: sum(getattr(r, name) for r in results) for name in
            ("n_hit", "n_hit_profile", "n_miss", "n_token_layers", "n_token_layers_all", "n_refused", "n_slots",
             "n_resident", "n_swap", "n_fill", "n_refused_lookups", "n_large")}
    return PolicyResult(results[0].policy, per_layer=per_layer, per_layer_refused=per_layer_refused, **sums)


def _looked_up(layers: Sequence[int], slots: dict[int, int], n_expert: int) -> list[int]:
    """Indices into the routing's layers of the layers the cache looks up: cached, and not held whole."""
    return [j for j, il in enumerate(layers) if il in slots and slots[il] < n_expert]


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


def _ubatches(routes: Routes, u0: int, u1: int) -> Routes:
    """Ubatches u0..u1-1 as routing of their own (views)."""
    if u0 == 0 and u1 == len(routes.starts) - 1:
        return routes
    a, b = int(routes.starts[u0]), int(routes.starts[u1])
    return Routes(routes.layers, routes.experts[a:b], routes.starts[u0:u1 + 1] - a)


def _large(routes: Routes, looked: list[int]) -> int:
    """(ubatch, layer) pairs of over 32 tokens: llama.cpp's path, no lookup."""
    if routes.one_token_ubatches:
        return 0
    return int((routes.layer_tokens[:, looked] > MAX_UBATCH).sum())


def _chunks(routes: Routes | TraceRoutes, chunk_tokens: int,
            progress: Progress | None) -> Iterator[Routes]:
    """Routing a chunk of whole ubatches at a time: views of a ``Routes``, or trace files read as they go."""
    if isinstance(routes, TraceRoutes):
        for _, chunk in routes.chunks(progress=progress, chunk_tokens=chunk_tokens):
            yield chunk
        return
    n_ub = len(routes.starts) - 1
    for u0, u1 in _ubatch_chunks(routes, chunk_tokens):
        yield _ubatches(routes, u0, u1)
        if progress:
            progress(u1, n_ub)


class Replay:
    """A policy's replay as a state that routing is fed to, a chunk of whole ubatches at a time, in order
    (``feed``); ``result()`` counts what was fed. Memory: the policy's state (slots, heats per layer) and
    the temporaries of one chunk, whatever the routing's length."""

    def feed(self, chunk: Routes) -> None:
        raise NotImplementedError

    def result(self) -> PolicyResult:
        raise NotImplementedError


def _drive(replay: Replay, routes: Routes | TraceRoutes, chunk_tokens: int, progress: Progress | None) -> PolicyResult:
    for chunk in _chunks(routes, chunk_tokens, progress):
        replay.feed(chunk)
    return replay.result()


class StaticReplay(Replay):
    """``static``: the residency never changes; vectorised over a chunk."""

    def __init__(self, layers: Sequence[int], slots: dict[int, int], n_expert: int,
                 profile: Sequence[tuple[int, int]]) -> None:
        self.looked = _looked_up(layers, slots, n_expert)
        self.cols = _columns(self.looked, len(layers))
        self.layers = [layers[j] for j in self.looked]
        filled = prefill_resident(profile, slots, n_expert)
        # the last column stays False, so that the -1 padding never hits
        self.resident = np.zeros((len(self.looked), n_expert + 1), dtype=bool)
        for i, il in enumerate(self.layers):
            self.resident[i, filled[il]] = True
        self.jj = np.arange(len(self.looked))[None, :, None]
        self.hits = np.zeros(len(self.looked), dtype=np.int64)
        self.misses = np.zeros(len(self.looked), dtype=np.int64)
        self.n_tokens = self.n_all_in = self.n_large = 0
        self.n_slots = sum(slots[il] for il in self.layers)

    def feed(self, chunk: Routes) -> None:
        cols, resident, jj = self.cols, self.resident, self.jj
        counted = chunk.counted[:, cols]
        d = chunk.distinct[:, cols]
        held = resident[jj, d]
        self.hits += (held & counted[:, :, None]).sum(axis=(0, 2))
        self.misses += ((d >= 0) & ~held & counted[:, :, None]).sum(axis=(0, 2))
        if chunk.one_token_ubatches:
            tokens = counted & chunk.computed[:, cols]
        else:
            tokens = counted[chunk.ubatch_of_token] & chunk.computed[:, cols]
        self.n_tokens += int(tokens.sum())
        self.n_all_in += int((resident[jj, chunk.experts[:, cols]].all(axis=-1) & tokens).sum())
        self.n_large += _large(chunk, self.looked)

    def result(self) -> PolicyResult:
        h = int(self.hits.sum())
        return PolicyResult("static", h, h, int(self.misses.sum()), self.n_tokens, self.n_all_in, 0,
                            self.n_slots, int(self.resident.sum()),
                            {il: (int(a), int(b)) for il, a, b in zip(self.layers, self.hits, self.misses)},
                            n_large=self.n_large)


def static(routes: Routes | TraceRoutes, slots: dict[int, int], n_expert: int, profile: Sequence[tuple[int, int]],
           progress: Progress | None = None, chunk_tokens: int = CHUNK_TOKENS) -> PolicyResult:
    """The hybrid without adaptation: the engine's fill from the profile, then nothing moves. Counts exactly
    like the engine's hybrid counters (n_hit, n_hit_profile = n_hit, n_miss, per layer). Vectorised: the
    residency never changes; a chunk of ubatches at a time."""
    return _drive(StaticReplay(routes.layers, slots, n_expert, profile), routes, chunk_tokens, progress)


def lru(routes: Routes | TraceRoutes, slots: dict[int, int], n_expert: int, profile: Sequence[tuple[int, int]] = (),
        progress: Progress | None = None, chunk_tokens: int = 1024) -> PolicyResult:
    """The upload mode, slot for slot as the engine runs it (victims by slot order on ties), from the
    engine's fill of the profile. One-token ubatches (a trace file's) are replayed with every layer at once
    (``LruTokensReplay``, the same counts); larger ones slot by slot."""
    replay = (LruTokensReplay if routes.one_token_ubatches else LruLoopReplay)(routes.layers, routes.k, slots,
                                                                               n_expert, profile)
    return _drive(replay, routes, chunk_tokens, progress)


def _lru_loop(routes: Routes, slots: dict[int, int], n_expert: int, profile: Sequence[tuple[int, int]],
              progress: Progress | None = None) -> PolicyResult:
    """``lru`` slot by slot, layer by layer, ubatch by ubatch: llama_moe_cache::lookup in Python."""
    return _drive(LruLoopReplay(routes.layers, routes.k, slots, n_expert, profile), routes, CHUNK_TOKENS, progress)


class LruLoopReplay(Replay):
    """``lru`` slot by slot: llama_moe_cache::lookup in Python, each layer its own slots and stamps."""

    def __init__(self, layers: Sequence[int], k: int, slots: dict[int, int], n_expert: int,
                 profile: Sequence[tuple[int, int]]) -> None:
        self.k = k
        self.looked = _looked_up(layers, slots, n_expert)
        self.layers = [layers[j] for j in self.looked]
        filled = prefill_resident(profile, slots, n_expert)
        # per looked-up layer: slots, expert_in, slot_of, last_use, from_profile, [stamp, hits, misses, refused]
        self.state = []
        for il in self.layers:
            n = slots[il]
            self.state.append((n, filled[il] + [-1] * (n - len(filled[il])), {e: s for s, e in enumerate(filled[il])},
                               [0] * n, [e >= 0 for e in filled[il]] + [False] * (n - len(filled[il])), [0, 0, 0, 0]))
        self.hits_profile = self.refused_lookups = self.large = self.token_layers = self.all_in = 0
        self.n_slots = sum(slots[il] for il in self.layers)

    def feed(self, chunk: Routes) -> None:
        bounds = list(zip(chunk.starts[:-1].tolist(), chunk.starts[1:].tolist()))
        k = self.k
        for j, (n, expert_in, slot_of, last_use, from_profile, acc) in zip(self.looked, self.state):
            counted, n_tokens = chunk.counted[:, j].tolist(), chunk.layer_tokens[:, j].tolist()
            stamp, lh, lm, lr = acc
            for u, (a, b) in enumerate(bounds):
                if not n_tokens[u]:
                    continue
                if not counted[u]:  # over 32 tokens: llama.cpp's path
                    self.large += 1
                    continue
                rows = [row for row in chunk.experts[a:b, j].tolist() if row[0] >= 0]
                # the engine looks up only ubatches whose experts all fit the slots at once; it refuses the
                # others, and counts their distinct experts
                if n_tokens[u] * k > n:
                    self.refused_lookups += 1
                    self.token_layers += len(rows)
                    lr += len({e for row in rows for e in row})
                    continue
                stamp += 1
                for row in rows:  # h_layer: resident before this ubatch's uploads
                    self.all_in += all(e in slot_of for e in row)
                self.token_layers += len(rows)
                ids = [e for row in rows for e in row]
                for e in ids:  # hits first, distinct per ubatch
                    s = slot_of.get(e, -1)
                    if s >= 0 and last_use[s] != stamp:
                        last_use[s] = stamp
                        lh += 1
                        self.hits_profile += from_profile[s]
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
            acc[:] = stamp, lh, lm, lr

    def result(self) -> PolicyResult:
        per_layer = {il: (acc[1], acc[2]) for il, (*_, acc) in zip(self.layers, self.state)}
        refused = {il: acc[3] for il, (*_, acc) in zip(self.layers, self.state)}
        return PolicyResult("lru", sum(h for h, _ in per_layer.values()), self.hits_profile,
                            sum(m for _, m in per_layer.values()), self.token_layers, self.all_in,
                            sum(refused.values()), self.n_slots, sum(len(st[2]) for st in self.state), per_layer,
                            per_layer_refused=refused, n_refused_lookups=self.refused_lookups, n_large=self.large)


class LruTokensReplay(Replay):
    """``lru`` for one-token ubatches, every layer at once: per token, the hits of all layers in one lookup,
    then each layer's misses into its slots in key order, key = (occupied, last use, slot) among the slots
    the token does not use: exactly the victims the slot-by-slot loop picks one after another (each victim
    it takes is then used by the token and drops out). A token's lookup is refused in a layer whose slots
    are fewer than k (its distinct experts count as refused). An id repeated within a token counts once, as
    in the loop."""

    def __init__(self, layers: Sequence[int], k: int, slots: dict[int, int], n_expert: int,
                 profile: Sequence[tuple[int, int]]) -> None:
        self.looked = _looked_up(layers, slots, n_expert)
        self.cols = _columns(self.looked, len(layers))
        self.layers = [layers[j] for j in self.looked]
        n_l, self.k = len(self.looked), k
        filled = prefill_resident(profile, slots, n_expert)
        self.n_slots = np.array([slots[il] for il in self.layers], dtype=np.int64)
        width = self.width = int(self.n_slots.max()) if n_l else 1
        self.expert_in = np.full((n_l, width), -1, dtype=np.int64)
        self.slot_of = np.full((n_l, n_expert + 1), -1, dtype=np.int64)  # the last column: the -1 of an uncomputed token
        self.last_use = np.zeros((n_l, width), dtype=np.int64)
        self.from_profile = np.zeros((n_l, width), dtype=bool)
        for i, il in enumerate(self.layers):
            f = filled[il]
            self.expert_in[i, :len(f)], self.slot_of[i, f], self.from_profile[i, :len(f)] = f, np.arange(len(f)), True
        self.slot_no = np.arange(width, dtype=np.int64)
        self.absent = self.slot_no[None, :] >= self.n_slots[:, None]  # slots a layer with fewer than the most does not have
        self.fits = k <= self.n_slots  # else every lookup in the layer is refused: its slots cannot take a token's k experts
        self.rows = np.arange(n_l)[:, None]
        self.later = np.tril(np.ones((k, k), dtype=bool), -1)  # [i, j]: position j comes before position i
        self.hits = np.zeros(n_l, dtype=np.int64)
        self.misses = np.zeros(n_l, dtype=np.int64)
        self.refused = np.zeros(n_l, dtype=np.int64)
        self.hits_profile = self.token_layers = self.all_in = self.refused_lookups = 0
        self.fed = 0  # tokens fed: the stamps go on from there

    def feed(self, chunk: Routes) -> None:
        n_l, width = len(self.looked), self.width
        expert_in, slot_of, last_use, from_profile = self.expert_in, self.slot_of, self.last_use, self.from_profile
        slot_no, absent, rows, never = self.slot_no, self.absent, self.rows, np.iinfo(np.int64).max
        ids = chunk.experts[:, self.cols].astype(np.int64)  # [tokens, layers, k], converted and checked for repeats at once
        active = chunk.computed[:, self.cols]
        repeats = (ids[:, :, :, None] == ids[:, :, None, :]) & self.later
        repeated = repeats.any(axis=3) if repeats.any() else None
        del repeats
        refused = active & ~self.fits
        if refused.any():
            distinct = self.k - (repeated.sum(axis=2) if repeated is not None else 0)  # per (token, layer)
            self.refused += (refused * distinct).sum(axis=0)
            self.refused_lookups += int(refused.sum())
        self.token_layers += int(active.sum())  # refused ones too: they are never all resident
        active = active & self.fits
        a = self.fed
        self.fed += chunk.n_tokens
        for t in range(chunk.n_tokens):
            act = active[t]
            if not act.any():
                continue
            stamp = a + t + 1  # increases token by token: the order the engine's per-layer stamps keep
            e = ids[t]
            s = slot_of[rows, e]
            res = s >= 0
            self.all_in += int((res.all(axis=1) & act).sum())
            asked = act[:, None] if repeated is None else act[:, None] & ~repeated[t]
            hit = res & asked
            miss = ~res & asked
            hr, hc = np.nonzero(hit)
            if hr.size:
                hs = s[hr, hc]
                self.hits_profile += int(from_profile[hr, hs].sum())
                last_use[hr, hs] = stamp
                self.hits += np.bincount(hr, minlength=n_l)
            mr, mc = np.nonzero(miss)
            if not mr.size:
                continue
            m = np.bincount(mr, minlength=n_l)
            self.misses += m
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

    def result(self) -> PolicyResult:
        return PolicyResult("lru", int(self.hits.sum()), self.hits_profile, int(self.misses.sum()), self.token_layers,
                            self.all_in, int(self.refused.sum()), int(self.n_slots.sum()),
                            int((self.expert_in >= 0).sum()),
                            {il: (int(h), int(m)) for il, h, m in zip(self.layers, self.hits, self.misses)},
                            per_layer_refused={il: int(r) for il, r in zip(self.layers, self.refused)},
                            n_refused_lookups=self.refused_lookups)


class AdaptiveReplay(Replay):
    """``adaptive``: heats per (layer, expert), fills and swaps between ubatches."""

    def __init__(self, layers: Sequence[int], slots: dict[int, int], n_expert: int, profile: Sequence[tuple[int, int]] = (),
                 half_life: float = HALF_LIFE_TOKENS, swap_every: int = SWAP_EVERY, max_swaps: int = MAX_SWAPS,
                 fill_every: int = FILL_EVERY, max_fills: int = MAX_FILLS, k: int = 0,
                 prior_tokens: float = PRIOR_TOKENS) -> None:
        self.n_expert = n_expert
        self.looked = _looked_up(layers, slots, n_expert)
        self.cols = _columns(self.looked, len(layers))
        filled = prefill_resident(profile, slots, n_expert)
        self.layers = [layers[j] for j in self.looked]
        self.cap = np.array([slots[il] for il in self.layers], dtype=np.int64)
        self.resident = np.zeros((len(self.looked), n_expert + 1), dtype=bool)  # the last column takes the -1 padding
        for i, il in enumerate(self.layers):
            self.resident[i, filled[il]] = True
        self.from_profile = self.resident.copy()
        self.heat = np.zeros((len(self.looked), n_expert + 1))
        # the profile's experts start with a prior: a pick or two of text does not evict them
        self.heat[self.from_profile] = np.repeat(prior_tokens * k / np.maximum(self.cap, 1), self.from_profile.sum(axis=1))
        self.fade = 0.5 ** (1.0 / half_life)
        self.swap_every, self.max_swaps, self.fill_every, self.max_fills = swap_every, max_swaps, fill_every, max_fills
        self.jj = np.arange(len(self.looked))[:, None]
        self.hits = np.zeros(len(self.looked), dtype=np.int64)
        self.misses = np.zeros(len(self.looked), dtype=np.int64)
        self.hits_profile = self.token_layers = self.all_in = self.n_swap = self.n_fill = self.generated = 0
        self.large = 0

    def feed(self, chunk: Routes) -> None:
        cols, jj, resident, from_profile, heat = self.cols, self.jj, self.resident, self.from_profile, self.heat
        n_expert = self.n_expert
        counted = chunk.counted[:, cols]
        distinct = chunk.distinct[:, cols]
        computed = chunk.computed[:, cols]
        experts = chunk.experts[:, cols]
        starts = chunk.starts.tolist()
        sizes = np.diff(chunk.starts).tolist()
        for i in np.flatnonzero(counted.any(axis=1)).tolist():
            c = counted[i]
            d = np.where(c[:, None], distinct[i], -1)  # the layers that did not look up select nothing
            held = resident[jj, d]
            self.hits += held.sum(axis=1)
            self.misses += ((d >= 0) & ~held).sum(axis=1)
            self.hits_profile += int((held & from_profile[jj, d]).sum())
            a, b = starts[i], starts[i + 1]
            tokens = c[None, :] & computed[a:b]
            self.token_layers += int(tokens.sum())
            self.all_in += int((resident[jj[None], experts[a:b]].all(axis=-1) & tokens).sum())
            n = sizes[i] if sizes[i] <= MAX_UBATCH else 0
            heat *= self.fade ** n
            heat[jj, d] += 1.0
            heat[:, n_expert] = 0.0
            before, self.generated = self.generated, self.generated + n
            if self.generated // self.fill_every > before // self.fill_every:
                self.n_fill += _fill(resident, from_profile, heat, self.cap, n_expert, self.max_fills)
            if self.generated // self.swap_every > before // self.swap_every:
                self.n_swap += _swap(resident, from_profile, heat, n_expert, self.max_swaps)
        self.large += _large(chunk, self.looked)

    def result(self) -> PolicyResult:
        return PolicyResult("adaptive", int(self.hits.sum()), self.hits_profile, int(self.misses.sum()),
                            self.token_layers, self.all_in, 0, int(self.cap.sum()), int(self.resident.sum()),
                            {il: (int(h), int(m)) for il, h, m in zip(self.layers, self.hits, self.misses)},
                            self.n_swap, self.n_fill, n_large=self.large)


def adaptive(routes: Routes | TraceRoutes, slots: dict[int, int], n_expert: int, profile: Sequence[tuple[int, int]] = (),
             half_life: float = HALF_LIFE_TOKENS, swap_every: int = SWAP_EVERY, max_swaps: int = MAX_SWAPS,
             fill_every: int = FILL_EVERY, max_fills: int = MAX_FILLS,
             progress: Progress | None = None, chunk_tokens: int = CHUNK_TOKENS,
             prior_tokens: float = PRIOR_TOKENS) -> PolicyResult:
    """The adaptive hybrid: counts like ``static``, and follows the text. Each lookup adds 1 to the heat of
    each (layer, expert) it selected (distinct per ubatch); all heats fade by 0.5**(1/half_life) per
    generated token (a ubatch of up to 32 tokens counts its tokens; a larger one, a prompt, does not move
    the clock). Once the generated tokens pass a multiple of ``fill_every``, free slots take the hottest
    experts not held (heat > 0), up to ``max_fills``; past a multiple of ``swap_every``, the hottest missing
    experts of all layers replace their own layer's coldest resident ones, hottest first, while
    heat(in) > 1.5 heat(out) + 2, at most ``max_swaps``. The profile's experts start with the heat of their
    share of ``prior_tokens`` tokens' picks (k / slots each): a text evicts them only once its own picks outweigh
    that. Changes apply from the next ubatch (the engine
    swaps between tokens)."""
    replay = AdaptiveReplay(routes.layers, slots, n_expert, profile, half_life, swap_every, max_swaps, fill_every,
                            max_fills, routes.k, prior_tokens)
    return _drive(replay, routes, chunk_tokens, progress)


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


BELADY_GROUP_BYTES = 16 << 20  # a streamed belady reads as many layers' ids per pass as fit in this (at least one)


def belady(routes: Routes | TraceRoutes, slots: dict[int, int], n_expert: int, progress: Progress | None = None,
           chunk_tokens: int = CHUNK_TOKENS) -> PolicyResult:
    """The ceiling: per layer, Belady's rule with bypass over the lookups' distinct experts. On a miss with
    the slots full, the expert needed furthest in the future (the newcomer included: then it is not
    admitted) leaves. Each layer starts holding the experts it will need first, as a perfect profile would.
    No policy that loads an expert when it is selected (lru, static) can hit more; one that loads ahead of
    selection (adaptive's swaps) could pass it, by at most one hit per expert it loads. Knowing the future
    takes a layer's lookups at once: its ids and each one's next use (numpy, 5 bytes per id of the layer at
    int8 ids), replayed a chunk at a time. Streamed trace files are read once per group of layers
    (``BELADY_GROUP_BYTES`` of their ids, or one layer)."""
    if isinstance(routes, TraceRoutes):
        return replay_jobs(routes, [Job(0, routes.n_tokens, "belady", slots)], n_expert, progress, chunk_tokens)[0]
    return _belady_routes(routes, slots, n_expert, progress, chunk_tokens)


def _belady_routes(routes: Routes, slots: dict[int, int], n_expert: int, progress: Progress | None = None,
                   chunk_tokens: int = CHUNK_TOKENS) -> PolicyResult:
    looked = _looked_up(routes.layers, slots, n_expert)
    hits = misses = token_layers = all_in = n_resident = 0
    per_layer: dict[int, tuple[int, int]] = {}
    one_token = routes.one_token_ubatches
    for done, j in enumerate(looked):
        il, n = routes.layers[j], slots[routes.layers[j]]
        col = routes.counted[:, j]
        if one_token and col.all():  # every token looked up (a trace file): the column itself, no index
            lookups, n_lookups, d = None, len(col), routes.distinct[:, j]
        else:
            lookups = np.flatnonzero(col)
            n_lookups, d = len(lookups), routes.distinct[lookups, j]
        del col
        valid = d >= 0
        if valid.all():  # every lookup has its full width: its ids are at fixed steps
            width, ends = d.shape[1], None
            flat = np.ascontiguousarray(d).reshape(-1)  # the layer's lookups one after another
        else:
            width, ends = 0, np.concatenate(([0], np.cumsum(valid.sum(axis=1))))
            flat = d[valid]
        del valid, d
        pos_type = np.int32 if flat.size < np.iinfo(np.int32).max else np.int64
        never = int(np.iinfo(pos_type).max)
        next_use, first_pos = _next_uses(flat, n_expert, never, pos_type, chunk_tokens * routes.k)
        seen = np.flatnonzero(first_pos != never)
        soonest = seen[np.argsort(first_pos[seen], kind="stable")[:n]]  # the experts needed first, soonest first
        when = dict(zip(soonest.tolist(), first_pos[soonest].tolist()))  # resident expert -> its next use
        heap = [(-pos, e) for e, pos in when.items()]  # (-next use, expert): the one needed last on top
        heapq.heapify(heap)
        push, pop = heapq.heappush, heapq.heappop
        lh = lm = 0
        step = max(1, chunk_tokens)
        for c0 in range(0, n_lookups, step):  # Python lists for a chunk of lookups at a time
            c1 = min(c0 + step, n_lookups)
            if ends is None:
                p0, p1 = c0 * width, c1 * width
                bounds = list(range(0, p1 - p0 + 1, width))
            else:
                p0, p1 = int(ends[c0]), int(ends[c1])
                bounds = (ends[c0:c1 + 1] - p0).tolist()
            ids_c, uses_c = flat[p0:p1].tolist(), next_use[p0:p1].tolist()
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
        del flat, next_use
        hits, misses = hits + lh, misses + lm
        per_layer[il] = (lh, lm)
        n_resident += len(when)
        if progress:
            progress(done + 1, len(looked))
    return PolicyResult("belady", hits, 0, misses, token_layers, all_in, 0,
                        sum(slots[routes.layers[j]] for j in looked), n_resident, per_layer,
                        n_large=_large(routes, looked))


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


def replayer(name: str, layers: Sequence[int], k: int, one_token: bool, slots: dict[int, int], n_expert: int,
             profile: Sequence[tuple[int, int]]) -> Replay:
    """The ``Replay`` of one of POLICIES but belady (which needs the future), started from the profile."""
    if name == "lru":
        return (LruTokensReplay if one_token else LruLoopReplay)(layers, k, slots, n_expert, profile)
    if name == "static":
        return StaticReplay(layers, slots, n_expert, profile)
    if name == "adaptive":
        return AdaptiveReplay(layers, slots, n_expert, profile, k=k)
    raise ValueError(f"unknown policy {name!r}; one of {', '.join(POLICIES)}")


def run_policy(name: str, routes: Routes | TraceRoutes, slots: dict[int, int], n_expert: int,
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


@dataclass(frozen=True)
class Job:
    """One replay: ``policy`` over tokens ``a:b`` of a routing, with ``slots``, from ``profile``."""

    a: int
    b: int
    policy: str
    slots: dict[int, int]
    profile: Sequence[tuple[int, int]] = ()


class _Meter:
    """Progress over steps of known weights: each step reports ``(done, total)`` of its own."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total, self.done, self.progress = max(1, total), 0, progress

    def part(self, weight: int) -> Progress | None:
        if self.progress is None:
            return None
        base, report, total = self.done, self.progress, self.total
        self.done += weight
        return lambda d, t: report(base + (weight * d // t if t else weight), total)


def replay_jobs(routes: Routes | TraceRoutes, jobs: Sequence[Job], n_expert: int, progress: Progress | None = None,
                chunk_tokens: int = CHUNK_TOKENS) -> list[PolicyResult]:
    """Every job's result, as ``run_policy(job.policy, routes.tokens(job.a, job.b), ...)`` gives it. A routing
    in memory replays its jobs one after another. Trace files are read once for all the jobs but belady's,
    each fed the chunks of its tokens (the chunks are cut at every job's edges), and once per group of layers
    for belady's (as many layers' ids of the tokens they span as fit in ``BELADY_GROUP_BYTES``, at least one).
    Memory: the replays' states, a chunk, and for belady a group of layers and one layer's next uses."""
    results: list[PolicyResult | None] = [None] * len(jobs)
    feeding = [i for i, job in enumerate(jobs) if job.policy != "belady"]
    future = [i for i, job in enumerate(jobs) if job.policy == "belady"]
    if isinstance(routes, Routes):
        meter = _Meter(sum(jobs[i].b - jobs[i].a for i in range(len(jobs))), progress)
        for i, job in enumerate(jobs):
            part = routes if (job.a, job.b) == (0, routes.n_tokens) else routes.tokens(job.a, job.b)
            tick = meter.part(job.b - job.a)
            if job.policy == "belady":
                results[i] = _belady_routes(part, job.slots, n_expert, tick, chunk_tokens)
            else:
                replay = replayer(job.policy, part.layers, part.k, part.one_token_ubatches, job.slots, n_expert, job.profile)
                results[i] = _drive(replay, part, chunk_tokens, tick)
        return results  # type: ignore[return-value]
    n_layers = len(routes.layers)
    groups: list[list[int]] = []
    if future:
        lo, hi = min(jobs[i].a for i in future), max(jobs[i].b for i in future)
        looked = sorted({j for i in future for j in _looked_up(routes.layers, jobs[i].slots, n_expert)})
        per_layer = max(1, (hi - lo) * routes.k * routes.dtype.itemsize)
        size = max(1, BELADY_GROUP_BYTES // per_layer)
        groups = [looked[g:g + size] for g in range(0, len(looked), size)]
    span = [jobs[i].b - jobs[i].a for i in range(len(jobs))]
    # weights: a pass feeding the replays; per group of layers, reading it and replaying its layers
    feed_weight = sum(span[i] for i in feeding)
    group_weights = [(hi - lo) // 4 + sum(span[i] * len(g) // n_layers for i in future) for g in groups] if future else []
    meter = _Meter(feed_weight + sum(group_weights), progress)
    if feeding:
        a0, b0 = min(jobs[i].a for i in feeding), max(jobs[i].b for i in feeding)
        source = routes if (a0, b0) == (0, routes.n_tokens) else routes.tokens(a0, b0)
        replays = {i: replayer(jobs[i].policy, routes.layers, routes.k, True, jobs[i].slots, n_expert, jobs[i].profile)
                   for i in feeding}
        cuts = sorted({x - a0 for i in feeding for x in (jobs[i].a, jobs[i].b)})
        for t, chunk in source.chunks(cuts, meter.part(feed_weight), chunk_tokens):
            t += a0
            for i in feeding:
                if jobs[i].a <= t < jobs[i].b:
                    replays[i].feed(chunk)
        for i in feeding:
            results[i] = replays[i].result()
    if future:
        parts: dict[int, list[PolicyResult]] = {i: [] for i in future}
        source = routes if (lo, hi) == (0, routes.n_tokens) else routes.tokens(lo, hi)
        for g, weight in zip(groups, group_weights):
            read = meter.part((hi - lo) // 4)
            cols = source.columns(g, read)
            for i in future:
                job = jobs[i]
                part = cols if (job.a, job.b) == (lo, hi) else cols.tokens(job.a - lo, job.b - lo)
                parts[i].append(_belady_routes(part, job.slots, n_expert, meter.part(span[i] * len(g) // n_layers),
                                               chunk_tokens))
                del part
            del cols
        for i in future:
            results[i] = (merge_results(parts[i]) if parts[i] else
                          PolicyResult("belady", 0, 0, 0, 0, 0, 0, 0, 0, {}))
    return results  # type: ignore[return-value]
