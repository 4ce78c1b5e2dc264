"""``adaptive``: the hybrid that swaps hot experts in (docs/cache.md, "Adaptive"), with the engine's constants."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..ranking import CHUNK_TOKENS, prefill_resident
from ..routes import Routes
from ..tracefiles import TraceRoutes
from ..budget import MAX_UBATCH
from .base import PolicyResult, Progress, Replay, _columns, drive, _large, _looked_up

# the adaptive cache's constants: the engine's LLAMA_MOE_ADAPT_* (src/llama-moe-policy.h, added by the patch series)
HALF_LIFE_TOKENS = 350   # heats halve over this many generated tokens
SWAP_EVERY = 32          # a round of swaps every this many generated tokens
MAX_SWAPS = 64           # experts swapped in per round, over all layers
SWAP_RATIO = 1.5         # an expert comes in only when heat(in) > SWAP_RATIO * heat(out) + SWAP_MARGIN
SWAP_MARGIN = 2.0
PRIOR_TOKENS = 64.0      # a profile's expert starts as hot as its share (k / slots) of this many tokens' picks
FILL_EVERY = 8           # free slots are filled every this many generated tokens,
MAX_FILLS = 128          # at most this many at a time



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
    return drive(replay, routes, chunk_tokens, progress)


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


def adaptive_replay(layers: Sequence[int], k: int, one_token: bool, slots: dict[int, int], n_expert: int,
                    profile: Sequence[tuple[int, int]]) -> Replay:
    return AdaptiveReplay(layers, slots, n_expert, profile, k=k)
