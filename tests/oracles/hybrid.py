"""An independent replay of the engine's hybrid cache (llama-moe-cache.cpp's count_hybrid and admission), static
or admitting, with each layer's own slot count, written apart from the package's policies."""
from __future__ import annotations

from typing import Iterable, Sequence

from llama_moe.formats.trace import RoutingRecord

from .lru import MAX_UBATCH, SimResult, prefilled_layers


def simulate_hybrid(records: Iterable[RoutingRecord], slots: dict[int, int], n_expert: int, admit: int = 0,
                    prefill: Sequence[tuple[int, int]] = (),
                    background: bool = False) -> tuple[SimResult, dict[int, list[int]], int]:
    """The hybrid, static or admitting synchronously (``admit`` > 0), with each layer's own slot count: per layer
    and ubatch of up to 32 tokens, a selected expert in a slot is a hit (once per ubatch) and marks the slot used;
    a missed one (once per ubatch) is computed on the CPU and, when admitting, waits in first-seen order. Before
    the next decode (a record of a layer not after the one before), each layer uploads its first ``admit``
    waiting experts it lacks, each into its first free slot, else the least recently used one (the lowest of
    equals), marked as used after every hit of the decode before; a round never evicts what it admitted or what
    the decode before used (a layer whose slots all hold such experts admits no more). ``prefill`` fills the slots
    in rank order at the start. In the ``background``, an admitted expert evicts its slot's expert at once but is
a hit only from the decode after the next one (the next decode starts by waiting for the round before it, whose
experts land as used by the decode just done). Returns the counters, each layer's slot -> expert (-1: free or
still in flight) and the experts admitted."""
    layers = prefilled_layers(slots, n_expert, prefill)
    queues: dict[int, list[int]] = {il: [] for il in layers}
    in_flight: dict[int, set[int]] = {il: set() for il in layers}
    last_lookup = {il: 0 for il in layers}
    per_layer = {il: [0, 0] for il in layers}
    clock = admitted = hits_profile = 0
    prev_il: int | None = None
    for rec in records:
        layer = layers.get(rec.il)
        if layer is None or rec.experts.shape[0] > MAX_UBATCH:
            continue
        if prev_il is not None and rec.il <= prev_il and admit > 0:  # the next decode starts
            for il, l in layers.items():
                for s in in_flight[il]:  # the round before is complete
                    l.slot_of[l.expert_in[s]] = s
                    l.last_use[s] = clock
                in_flight[il].clear()
            clock += 1
            for il, l in layers.items():
                n = 0
                for e in queues[il]:
                    if n >= admit:
                        break
                    if e in l.expert_in:  # held, or admitted earlier in this round
                        continue
                    free = [s for s, x in enumerate(l.expert_in) if x < 0]
                    s = free[0] if free else min(range(l.n_slots), key=lambda i: (l.last_use[i], i))
                    if l.expert_in[s] >= 0 and l.last_use[s] >= last_lookup[il]:
                        break  # every slot holds what this round admitted or the decode before used
                    if l.expert_in[s] >= 0:
                        del l.slot_of[l.expert_in[s]]
                    l.expert_in[s], l.last_use[s], l.from_profile[s] = e, clock, False
                    if background:
                        in_flight[il].add(s)
                    else:
                        l.slot_of[e] = s
                    n += 1
                queues[il].clear()
                admitted += n
        prev_il = rec.il
        clock += 1
        last_lookup[rec.il] = clock
        seen: set[int] = set()
        for e in rec.experts.ravel().tolist():
            if e < 0 or e in seen:
                continue
            seen.add(e)
            s = layer.slot_of.get(e, -1)
            if s >= 0:
                per_layer[rec.il][0] += 1
                hits_profile += layer.from_profile[s]
                layer.last_use[s] = clock
            else:
                per_layer[rec.il][1] += 1
                queues[rec.il].append(e)
    hits = sum(h for h, _ in per_layer.values())
    misses = sum(m for _, m in per_layer.values())
    result = SimResult(hits, hits_profile, misses, {il: (h, m) for il, (h, m) in per_layer.items()},
                       n_cpu=0, per_layer_cpu={il: 0 for il in layers})
    held = {il: [e if s not in in_flight[il] else -1 for s, e in enumerate(l.expert_in)] for il, l in layers.items()}
    return result, held, admitted
