"""``admit``: the hybrid with admission (``--moe-cache-admit N``, llama_moe_cache::admit): a ubatch's hits run
from the slots and its misses on the CPU; after the ubatch (one decode) each layer uploads up to N of its
distinct misses, first missed first, into a free slot, else the least recently used one (the lowest of equals),
and an admitted expert counts as just used. Over 32 tokens a ubatch takes llama.cpp's path (no lookup). Nothing
is refused: the hybrid computes whatever the slots lack.

``admitN-lrfu`` (the simulator's alone: the engine evicts the least recently used slot) picks the victim by
recency and frequency together: every selection of an expert, held or not, adds 1 to its weight, and weights
halve every ``LRFU_HALF_LIFE`` tokens; the victim is the held expert of least weight (then the least recently
used, then the lowest slot). On the calibrated routing it hits up to 1.6 points more than LRU eviction and
never clearly less (docs/benchmarks.md, "Admission")."""
from __future__ import annotations

import heapq
from typing import Sequence

from ..budget import MAX_UBATCH
from ..ranking import prefill_resident
from ..routes import Routes
from ..repartition import HALVE_ROUNDS, ShadowStack, kept_slots, target
from .base import PolicyResult, Replay, _looked_up

ADMIT_CHUNK_TOKENS = 1024  # tokens fed at a time (the results do not depend on it)
REPARTITION_PERIODS = (16, 32, 64, 128, 256)  # the admitNrepartR policies' periods, in decodes
LRFU_HALF_LIFE = 16.0  # tokens over which an expert's weight halves (admitN-lrfu): of 8, 16 and 64, the best overall


class AdmitReplay(Replay):
    """Slot by slot, each layer its own slots and stamps, as the engine counts (llama_moe_policy::count_hybrid, admit)."""

    def __init__(self, layers: Sequence[int], k: int, slots: dict[int, int], n_expert: int,
                 profile: Sequence[tuple[int, int]], admit: int, lrfu_half_life: float | None = None,
                 repartition: int = 0) -> None:
        if admit < 1:
            raise ValueError(f"admit must be at least 1 expert per layer and decode, got {admit}")
        if lrfu_half_life is not None and not lrfu_half_life > 0:
            raise ValueError(f"the LRFU half-life must be > 0 tokens, got {lrfu_half_life}")
        if repartition < 0:
            raise ValueError(f"repartition must be 0 (off) or a number of decodes, got {repartition}")
        self.repartition = repartition
        self.admit = admit
        self.fade = 0.5 ** (1.0 / lrfu_half_life) if lrfu_half_life else None
        self.weights: list[dict[int, tuple[float, int]]] = []  # lrfu, per layer: expert -> (weight, at token)
        self.tokens = 0
        self.looked = _looked_up(layers, slots, n_expert)
        self.layers = [layers[j] for j in self.looked]
        filled = prefill_resident(profile, slots, n_expert)
        # per looked-up layer: free slots (ascending), expert_in, slot_of, last_use, from_profile, [hits, misses],
        # and a heap of (last use, slot) with stale entries skipped: the victim is the least recently used slot,
        # the lowest of equals, as the engine's scan finds it
        self.state = []
        for il in self.layers:
            n, f = slots[il], filled[il]
            heap = [(0, s) for s in range(len(f))]
            self.state.append((list(range(len(f), n)), f + [-1] * (n - len(f)), {e: s for s, e in enumerate(f)},
                               [0] * n, [True] * len(f) + [False] * (n - len(f)), [0, 0], heap))
        self.weights = [{} for _ in self.layers]
        self.clock = 0
        self.hits_profile = self.large = self.token_layers = self.all_in = self.n_admit = 0
        self.n_slots = sum(slots[il] for il in self.layers)
        # online re-partitioning (repartition.py): shadow stacks, each layer's floor and cap, what it did
        self.shadows = [ShadowStack(n_expert) for _ in self.layers] if repartition else []
        self.floors = [min(k, slots[il]) for il in self.layers]
        self.caps = [n_expert - 1] * len(self.layers)
        self.decodes = self.rounds = self.n_repartition = self.n_moved = 0
        self.history: list[tuple[int, tuple[int, ...]]] = []  # (decodes so far, slots per looked-up layer)

    def feed(self, chunk: Routes) -> None:
        bounds = list(zip(chunk.starts[:-1].tolist(), chunk.starts[1:].tolist()))
        columns = [(chunk.counted[:, j].tolist(), chunk.layer_tokens[:, j].tolist()) for j in self.looked]
        fade = self.fade
        for u, (a, b) in enumerate(bounds):
            self.clock += 1  # the ubatch's lookups
            hit_stamp = self.clock
            if b - a <= MAX_UBATCH:
                self.tokens += b - a  # the weights' clock: generated tokens, as the adaptive cache's heats
            now = self.tokens
            queues = []
            for j, (_, _, slot_of, last_use, from_profile, acc, heap), (counted, n_tokens) in zip(
                    self.looked, self.state, columns):
                queue: list[int] = []
                queues.append(queue)
                if not n_tokens[u]:
                    continue
                if not counted[u]:  # over 32 tokens: llama.cpp's path
                    self.large += 1
                    continue
                rows = [row for row in chunk.experts[a:b, j].tolist() if row[0] >= 0]
                for row in rows:
                    self.all_in += all(e in slot_of for e in row)
                self.token_layers += len(rows)
                seen: set[int] = set()
                seen_order: list[int] = []
                weight = self.weights[len(queues) - 1]
                shadow = self.shadows[len(queues) - 1] if self.shadows else None
                for row in rows:
                    for e in row:
                        if e in seen:
                            continue
                        seen.add(e)
                        seen_order.append(e)
                        if fade is not None:
                            w, at = weight.get(e, (0.0, now))
                            weight[e] = (w * fade ** (now - at) + 1.0, now)
                        s = slot_of.get(e, -1)
                        if s >= 0:
                            last_use[s] = hit_stamp
                            if fade is None:  # lrfu scans the slots: no heap to keep
                                heapq.heappush(heap, (hit_stamp, s))
                            acc[0] += 1
                            self.hits_profile += from_profile[s]
                        else:
                            acc[1] += 1
                            queue.append(e)
                if shadow is not None:
                    shadow.touch(list(seen_order))
            self.clock += 1  # the admission after the decode: newer than every hit of it
            for (free, expert_in, slot_of, last_use, from_profile, _, heap), queue, weight in zip(
                    self.state, queues, self.weights):
                done = 0
                for e in queue:
                    if done >= self.admit:
                        break
                    # a round never evicts what it admitted or what the ubatch used (stamped hit_stamp or later)
                    if free:
                        victim = free.pop(0)
                    elif fade is not None:
                        def held(c: int) -> tuple[float, int, int]:
                            w, at = weight.get(expert_in[c], (0.0, now))
                            return w * fade ** (now - at), last_use[c], c
                        older = [c for c in range(len(expert_in)) if last_use[c] < hit_stamp]
                        if not older:
                            break
                        victim = min(older, key=held)
                        del slot_of[expert_in[victim]]
                    else:
                        while True:
                            stamp, victim = heapq.heappop(heap)
                            if stamp == last_use[victim]:
                                break
                        if stamp >= hit_stamp:
                            heapq.heappush(heap, (stamp, victim))
                            break
                        del slot_of[expert_in[victim]]
                    expert_in[victim], slot_of[e], from_profile[victim], last_use[victim] = e, victim, False, self.clock
                    if fade is None:
                        heapq.heappush(heap, (self.clock, victim))
                    done += 1
                self.n_admit += done
            if b - a <= MAX_UBATCH:
                self.decodes += 1
                if self.repartition and self.decodes % self.repartition == 0:
                    self._repartition()

    def slots_now(self) -> dict[int, int]:
        """Slots per looked-up layer now."""
        return {il: len(st[1]) for il, st in zip(self.layers, self.state)}

    def _repartition(self) -> None:
        current = [len(st[1]) for st in self.state]
        new = target([sh.hist for sh in self.shadows], current, self.floors, self.caps)
        self.rounds += 1
        if self.rounds % HALVE_ROUNDS == 0:
            for sh in self.shadows:
                sh.halve()
        if new is None:
            return
        self.n_repartition += 1
        for j, (c, t) in enumerate(zip(current, new)):
            if t == c:
                continue
            free, expert_in, slot_of, last_use, from_profile, acc, heap = self.state[j]
            if t < c:
                keep = kept_slots(expert_in, last_use, t)
                expert_in = [expert_in[s] for s in keep] + [-1] * (t - len(keep))
                last_use = [last_use[s] for s in keep] + [0] * (t - len(keep))
                from_profile = [from_profile[s] for s in keep] + [False] * (t - len(keep))
                free = list(range(len(keep), t))
            else:
                self.n_moved += t - c
                expert_in = expert_in + [-1] * (t - c)
                last_use = last_use + [0] * (t - c)
                from_profile = from_profile + [False] * (t - c)
                free = sorted(free + list(range(c, t)))
            slot_of = {e: s for s, e in enumerate(expert_in) if e >= 0}
            heap = [(last_use[s], s) for s, e in enumerate(expert_in) if e >= 0]
            heapq.heapify(heap)
            self.state[j] = (free, expert_in, slot_of, last_use, from_profile, acc, heap)
        self.history.append((self.decodes, tuple(new)))

    def result(self) -> PolicyResult:
        per_layer = {il: (st[5][0], st[5][1]) for il, st in zip(self.layers, self.state)}
        name = (f"admit{self.admit}" + ("-lrfu" if self.fade is not None else "") +
                (f"-repart{self.repartition}" if self.repartition else ""))
        return PolicyResult(name, sum(h for h, _ in per_layer.values()), self.hits_profile,
                            sum(m for _, m in per_layer.values()), self.token_layers, self.all_in, 0, self.n_slots,
                            sum(len(st[2]) for st in self.state), per_layer, n_swap=self.n_admit, n_large=self.large,
                            n_repartition=self.n_repartition, n_moved=self.n_moved)



def admit_replay(admit: int, lrfu_half_life: float | None = None, repartition: int = 0):
    """The factory of REPLAYS' signature for admission of ``admit`` experts per layer and decode (victims by
    weight with ``lrfu_half_life``, else least recently used), re-partitioning the slots between layers every
    ``repartition`` decodes (0: never)."""
    def make(layers: Sequence[int], k: int, one_token: bool, slots: dict[int, int], n_expert: int,
             profile: Sequence[tuple[int, int]]) -> Replay:
        return AdmitReplay(layers, k, slots, n_expert, profile, admit, lrfu_half_life, repartition)
    return make
