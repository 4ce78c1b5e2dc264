"""An independent replay of the engine's upload cache (llama-moe-cache.cpp's LRU), one expert at a time, written
apart from the package's policies: the tests hold the engine's counters and ``routing.policies.lru`` to it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

from llama_moe.formats.trace import RoutingRecord

MAX_UBATCH = 32  # LLAMA_MOE_CACHE_MAX_UBATCH: larger ubatches keep llama.cpp's path and are not looked up


@dataclass
class _LruLayer:
    n_slots: int
    expert_in: list[int] = field(default_factory=list)
    last_use: list[int] = field(default_factory=list)
    slot_of: dict[int, int] = field(default_factory=dict)
    from_profile: list[bool] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.expert_in = [-1] * self.n_slots
        self.last_use = [0] * self.n_slots
        self.from_profile = [False] * self.n_slots


@dataclass(frozen=True)
class SimResult:
    n_hit: int
    n_hit_profile: int
    n_miss: int
    per_layer: dict[int, tuple[int, int]]  # il -> (hits, misses)
    n_cpu: int = 0  # of the misses, those no slot was left for: the CPU computes them
    per_layer_cpu: dict[int, int] = field(default_factory=dict)

    @property
    def n_lookup(self) -> int:
        return self.n_hit + self.n_miss

    @property
    def hit_rate(self) -> float | None:
        """hits / (hits + misses); None when nothing was looked up."""
        return self.n_hit / self.n_lookup if self.n_lookup else None


def prefilled_layers(slots: dict[int, int], n_expert: int, prefill: Iterable[tuple[int, int]]) -> dict[int, _LruLayer]:
    """Each cached layer's slots (layers held whole need no lookups), filled in a profile's rank order."""
    layers = {il: _LruLayer(n) for il, n in slots.items() if n < n_expert}
    for il, e in prefill:
        layer = layers.get(il)
        if layer is None or e in layer.slot_of or -1 not in layer.expert_in:
            continue
        s = layer.expert_in.index(-1)
        layer.expert_in[s], layer.slot_of[e], layer.from_profile[s] = e, s, True
    return layers


def simulate_lru(records: Iterable[RoutingRecord], slots: dict[int, int], n_expert: int,
                 prefill: Sequence[tuple[int, int]] = ()) -> SimResult:
    """The upload mode: per layer and ubatch, each distinct selected expert a slot holds is a hit; each other one
    a miss, uploaded into a free slot or else the least recently used slot the ubatch does not use, or, once
    every slot serves the ubatch, computed on the CPU (a miss counted in ``n_cpu``; the slots stay).
    ``slots`` maps each cached layer to its slot count; ``prefill`` is a profile's ranked pairs."""
    layers = prefilled_layers(slots, n_expert, prefill)
    stamp = 0
    hits = hits_profile = misses = cpu = 0
    per_layer: dict[int, list[int]] = {il: [0, 0, 0] for il in layers}
    for rec in records:
        layer = layers.get(rec.il)
        if layer is None or rec.experts.shape[0] > MAX_UBATCH:
            continue
        stamp += 1
        for e in rec.experts.ravel().tolist():  # hits first, distinct per ubatch
            s = layer.slot_of.get(e, -1)
            if s >= 0 and layer.last_use[s] != stamp:
                layer.last_use[s] = stamp
                hits += 1
                hits_profile += layer.from_profile[s]
                per_layer[rec.il][0] += 1
        on_cpu: set[int] = set()
        for e in rec.experts.ravel().tolist():
            if e in layer.slot_of or e in on_cpu:
                continue
            misses += 1
            per_layer[rec.il][1] += 1
            victim = -1
            for c in range(layer.n_slots):
                if layer.expert_in[c] < 0:
                    victim = c
                    break
                if layer.last_use[c] != stamp and (victim < 0 or layer.last_use[c] < layer.last_use[victim]):
                    victim = c
            if victim < 0:
                on_cpu.add(e)
                cpu += 1
                per_layer[rec.il][2] += 1
                continue
            old = layer.expert_in[victim]
            if old >= 0:
                del layer.slot_of[old]
            layer.expert_in[victim], layer.slot_of[e] = e, victim
            layer.from_profile[victim] = False
            layer.last_use[victim] = stamp
    return SimResult(hits, hits_profile, misses, {il: (h, m) for il, (h, m, _) in per_layer.items()}, cpu,
                     {il: c for il, (_, _, c) in per_layer.items()})
