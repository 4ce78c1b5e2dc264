"""``static``: the hybrid without adaptation (count_hybrid): the profile's experts stay, the others run on the CPU."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..ranking import CHUNK_TOKENS, prefill_resident
from ..routes import Routes
from ..tracefiles import TraceRoutes
from .base import PolicyResult, Progress, Replay, _columns, drive, _large, _looked_up


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
    return drive(StaticReplay(routes.layers, slots, n_expert, profile), routes, chunk_tokens, progress)


def static_replay(layers: Sequence[int], k: int, one_token: bool, slots: dict[int, int], n_expert: int,
                  profile: Sequence[tuple[int, int]]) -> Replay:
    return StaticReplay(layers, slots, n_expert, profile)
