"""An independent replay of three tiers in upload mode (a device LRU over the RAM tier's LRU over the file),
one expert at a time, written apart from the engine: the tests hold the engine's RAM tier counters to it.

Per layer and ubatch of up to 32 tokens, the device's lookup is ``lru.simulate_lru``'s. Its misses that take a
slot move up from the RAM tier (exclusive tiers): counted there as hits or misses, they leave it, and the experts
their slots held go down into it, each into a free slot or else its least recently used one. The misses no slot
was left for (a ubatch with more distinct experts than the device's slots) are computed on the CPU from the tier,
looked up there like upload mode's own lookup (in expert order, hits first), so that they stay in it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from llama_moe.formats.trace import RoutingRecord

from oracles.lru import MAX_UBATCH


@dataclass
class _Slots:
    expert_in: list[int]
    last_use: list[int]

    @classmethod
    def empty(cls, n: int) -> "_Slots":
        return cls([-1] * n, [0] * n)

    def slot_of(self, e: int) -> int:
        return self.expert_in.index(e) if e in self.expert_in else -1

    def victim(self, stamp: int) -> int:
        """A free slot, else the least recently used one not used at ``stamp``; -1 when there is none."""
        v = -1
        for c, e in enumerate(self.expert_in):
            if e < 0:
                return c
            if self.last_use[c] != stamp and (v < 0 or self.last_use[c] < self.last_use[v]):
                v = c
        return v


@dataclass(frozen=True)
class TiersResult:
    n_ram_hit: int
    n_ram_miss: int
    n_demoted: int  # experts the device let go that the tier took


def simulate_three_tiers(records: Iterable[RoutingRecord], device_slots: int, ram_slots: int,
                         n_expert: int) -> TiersResult:
    device: dict[int, _Slots] = {}
    ram: dict[int, _Slots] = {}
    stamp = 0  # the engine's one clock for the tier's lookups
    dev_stamp = 0
    ram_hit = ram_miss = demoted = 0
    for rec in records:
        if rec.experts.shape[0] > MAX_UBATCH or device_slots >= n_expert:
            continue
        dev = device.setdefault(rec.il, _Slots.empty(device_slots))
        tier = ram.setdefault(rec.il, _Slots.empty(ram_slots))
        dev_stamp += 1
        ids = rec.experts.ravel().tolist()
        for e in ids:  # the device's hits, distinct per ubatch
            s = dev.slot_of(e)
            if s >= 0:
                dev.last_use[s] = dev_stamp
        placed: list[tuple[int, int]] = []  # (expert, what its slot held)
        on_cpu: set[int] = set()
        for e in ids:
            if e in dev.expert_in or e in on_cpu:
                continue
            s = dev.victim(dev_stamp)
            if s < 0:
                on_cpu.add(e)
                continue
            placed.append((e, dev.expert_in[s]))
            dev.expert_in[s], dev.last_use[s] = e, dev_stamp
        if ram_slots >= n_expert:
            continue  # a tier that holds the layer whole looks nothing up
        # up: counted, then they leave the tier
        for e, _ in placed:
            if e in tier.expert_in:
                ram_hit += 1
            else:
                ram_miss += 1
        for e, _ in placed:
            s = tier.slot_of(e)
            if s >= 0:
                tier.expert_in[s] = -1
        # down: what their slots held
        for _, old in placed:
            if old < 0 or old in tier.expert_in:
                continue
            stamp += 1
            s = tier.victim(stamp)
            if s >= 0:
                tier.expert_in[s], tier.last_use[s] = old, stamp
                demoted += 1
        # the CPU's rest, looked up in the tier
        if on_cpu:
            stamp += 1
            rest = sorted(on_cpu)
            for e in rest:
                s = tier.slot_of(e)
                if s >= 0:
                    ram_hit += 1
                    tier.last_use[s] = stamp
            for e in rest:
                if e in tier.expert_in:
                    continue
                ram_miss += 1
                s = tier.victim(stamp)
                if s >= 0:
                    tier.expert_in[s], tier.last_use[s] = e, stamp
    return TiersResult(ram_hit, ram_miss, demoted)
