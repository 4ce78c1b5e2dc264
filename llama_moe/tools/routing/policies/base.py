"""What every policy's replay shares: its result (``PolicyResult``), the ``Replay`` a routing is fed to a chunk of
whole ubatches at a time, and the chunking of a ``Routes`` in memory or of trace files as they are read."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import numpy as np

from ....policy_replay import max_ubatch
from ..ranking import CHUNK_TOKENS
from ..routes import Routes
from ..tracefiles import TraceRoutes

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class PolicyResult:
    """A policy's counts, as the engine counts them: per layer and ubatch it looks up, each distinct
    selected expert is a hit or a miss (nothing is refused: upload mode splits a ubatch its slots cannot
    serve whole, the hybrid computes every miss on the CPU)."""

    policy: str
    n_hit: int
    n_hit_profile: int      # hits on experts the profile put there and that stayed since
    n_miss: int             # the CPU's (n_cpu) included
    n_token_layers: int     # (layer, token) pairs looked up: h_layer's denominator
    n_token_layers_all: int  # of them, with all k experts resident: h_layer's numerator
    n_cpu: int              # (lru) of the misses, those computed on the CPU: the distinct experts of a ubatch
                            # beyond what the layer's slots can serve once every slot serves it, as the engine's
                            # n_cpu (upload mode's split); 0 for the hybrid's policies, whose misses all run there
    n_slots: int            # slots of the layers looked up
    n_resident: int         # of them, holding an expert at the end: a cache that never fills caps the hit rate
    per_layer: dict[int, tuple[int, int]] = field(default_factory=dict)  # il -> (hits, misses)
    n_swap: int = 0         # adaptive: experts swapped in for colder ones; admitN: experts admitted
    n_fill: int = 0         # adaptive: free slots filled
    per_layer_cpu: dict[int, int] = field(default_factory=dict)  # (lru) il -> misses computed on the CPU
    n_split_lookups: int = 0  # (lru) (ubatch, layer) lookups that left some of their experts to the CPU
    n_large: int = 0        # (ubatch, layer) pairs of over max_ubatch() tokens: llama.cpp's path, not looked up
    n_repartition: int = 0  # (admitN-repartR) rounds that moved slots between layers
    n_moved: int = 0        # (admitN-repartR) slots those rounds moved
    n_bytes_upload: int | None = None  # (the engine's policies, given the experts' sizes) bytes copied into the
                                       # slots as the engine's policy counts them (upload mode: the misses a slot
                                       # takes; the hybrid: its admissions), not the profile's fill at the start;
                                       # None: no sizes, or a simulator policy
    n_bytes_cpu: int | None = None     # the same, of the misses computed on the CPU (upload mode: its split's)
    n_ram_hit: int | None = None       # three tiers (a Job's ram_slots, the engine's policies): the RAM tier's hits
    n_ram_miss: int | None = None      #   and misses of the decodes (not the start's fill), None without a tier
    n_bytes_disk: int | None = None    #   the bytes those misses read from the model's file (with sizes)

    @property
    def n_lookup(self) -> int:
        """hits + misses: the distinct selections the cache was asked for."""
        return self.n_hit + self.n_miss

    @property
    def ram_hit_rate(self) -> float | None:
        """Three tiers: the RAM tier's hits over its lookups of the decodes; None without a tier or lookups."""
        if self.n_ram_hit is None or self.n_ram_miss is None or not self.n_ram_hit + self.n_ram_miss:
            return None
        return self.n_ram_hit / (self.n_ram_hit + self.n_ram_miss)

    @property
    def hit_rate(self) -> float | None:
        """hits / (hits + misses); None when nothing was looked up (every layer held whole)."""
        return self.n_hit / self.n_lookup if self.n_lookup else None

    @property
    def h_layer(self) -> float | None:
        return self.n_token_layers_all / self.n_token_layers if self.n_token_layers else None

    def layer_hit_rate(self, il: int) -> float | None:
        h, m = self.per_layer.get(il, (0, 0))
        return h / (h + m) if h + m else None


def merge_results(results: Sequence[PolicyResult]) -> PolicyResult:
    """Pools the counts of several replays (the folds of a k-fold): hits over lookups of all of them."""
    per_layer: dict[int, tuple[int, int]] = {}
    per_layer_cpu: dict[int, int] = {}
    for r in results:
        for il, (h, m) in r.per_layer.items():
            ph, pm = per_layer.get(il, (0, 0))
            per_layer[il] = (ph + h, pm + m)
        for il, n in r.per_layer_cpu.items():
            per_layer_cpu[il] = per_layer_cpu.get(il, 0) + n
    sums = {name: sum(getattr(r, name) for r in results) for name in
            ("n_hit", "n_hit_profile", "n_miss", "n_token_layers", "n_token_layers_all", "n_cpu", "n_slots",
             "n_resident", "n_swap", "n_fill", "n_split_lookups", "n_large", "n_repartition", "n_moved")}
    nbytes = {name: None if any(getattr(r, name) is None for r in results) else sum(getattr(r, name) for r in results)
              for name in ("n_bytes_upload", "n_bytes_cpu", "n_ram_hit", "n_ram_miss", "n_bytes_disk")}
    return PolicyResult(results[0].policy, per_layer=per_layer, per_layer_cpu=per_layer_cpu, **sums, **nbytes)


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
    """(ubatch, layer) pairs of over ``max_ubatch()`` tokens: llama.cpp's path, no lookup."""
    if routes.one_token_ubatches:
        return 0
    return int((routes.layer_tokens[:, looked] > max_ubatch()).sum())


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


def drive(replay: Replay, routes: Routes | TraceRoutes, chunk_tokens: int, progress: Progress | None) -> PolicyResult:
    for chunk in _chunks(routes, chunk_tokens, progress):
        replay.feed(chunk)
    return replay.result()


class Meter:
    """Progress over steps of known weights: each step reports ``(done, total)`` of its own."""

    def __init__(self, total: int, progress: Progress | None) -> None:
        self.total, self.done, self.progress = max(1, total), 0, progress

    def part(self, weight: int) -> Progress | None:
        if self.progress is None:
            return None
        base, report, total = self.done, self.progress, self.total
        self.done += weight
        return lambda d, t: report(base + (weight * d // t if t else weight), total)
