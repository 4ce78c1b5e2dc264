"""``admitN-lrfu``: the admitting hybrid with victims by recency and frequency together, a policy of the
simulator's alone (the engine's admission evicts the least recently used slot: ``admitN``, replayed by the engine,
``policies.engine``). A ubatch's hits run from the slots and its misses on the CPU; after the ubatch (one decode)
each layer admits up to N of its distinct misses, first missed first, into a free slot, else the held expert of
least weight: every selection of an expert, held or not, adds 1 to its weight, and weights halve every
``LRFU_HALF_LIFE`` tokens (then the least recently used, then the lowest slot); a round never evicts what it
admitted or what the ubatch used. Over ``max_ubatch()`` tokens a ubatch takes llama.cpp's path (no lookup). On
the calibrated routing it hits up to 1.6 points more than LRU eviction and never clearly less (docs/benchmarks.md,
"Admission")."""
from __future__ import annotations

from typing import Mapping, Sequence

from ....policy_replay import LayerShape, max_ubatch
from ..ranking import prefill_resident
from ..routes import Routes
from .base import PolicyResult, Replay, _looked_up

LRFU_CHUNK_TOKENS = 1024  # tokens fed at a time (the results do not depend on it)
LRFU_HALF_LIFE = 16.0  # tokens over which an expert's weight halves: of 8, 16 and 64, the best overall


class LrfuReplay(Replay):
    """Slot by slot, each layer its own slots and stamps (a simulator policy: the engine runs no LRFU)."""

    def __init__(self, layers: Sequence[int], k: int, slots: dict[int, int], n_expert: int,
                 profile: Sequence[tuple[int, int]], admit: int, half_life: float = LRFU_HALF_LIFE) -> None:
        if admit < 1:
            raise ValueError(f"admit must be at least 1 expert per layer and decode, got {admit}")
        if not half_life > 0:
            raise ValueError(f"the LRFU half-life must be > 0 tokens, got {half_life}")
        self.admit = admit
        self.fade = 0.5 ** (1.0 / half_life)
        self.max_ubatch = max_ubatch()
        self.tokens = 0
        self.looked = _looked_up(layers, slots, n_expert)
        self.layers = [layers[j] for j in self.looked]
        filled = prefill_resident(profile, slots, n_expert)
        # per looked-up layer: free slots (ascending), expert_in, slot_of, last_use, from_profile, [hits, misses]
        self.state = []
        for il in self.layers:
            n, f = slots[il], filled[il]
            self.state.append((list(range(len(f), n)), f + [-1] * (n - len(f)), {e: s for s, e in enumerate(f)},
                               [0] * n, [True] * len(f) + [False] * (n - len(f)), [0, 0]))
        self.weights: list[dict[int, tuple[float, int]]] = [{} for _ in self.layers]  # expert -> (weight, at token)
        self.clock = 0
        self.hits_profile = self.large = self.token_layers = self.all_in = self.n_admit = 0
        self.n_slots = sum(slots[il] for il in self.layers)

    def feed(self, chunk: Routes) -> None:
        bounds = list(zip(chunk.starts[:-1].tolist(), chunk.starts[1:].tolist()))
        columns = [(chunk.counted[:, j].tolist(), chunk.layer_tokens[:, j].tolist()) for j in self.looked]
        fade = self.fade
        for u, (a, b) in enumerate(bounds):
            self.clock += 1  # the ubatch's lookups
            hit_stamp = self.clock
            if b - a <= self.max_ubatch:
                self.tokens += b - a  # the weights' clock: generated tokens
            now = self.tokens
            queues = []
            for j, (_, _, slot_of, last_use, from_profile, acc), (counted, n_tokens), weight in zip(
                    self.looked, self.state, columns, self.weights):
                queue: list[int] = []
                queues.append(queue)
                if not n_tokens[u]:
                    continue
                if not counted[u]:  # over max_ubatch() tokens: llama.cpp's path
                    self.large += 1
                    continue
                rows = [row for row in chunk.experts[a:b, j].tolist() if row[0] >= 0]
                for row in rows:
                    self.all_in += all(e in slot_of for e in row)
                self.token_layers += len(rows)
                seen: set[int] = set()
                for row in rows:
                    for e in row:
                        if e in seen:
                            continue
                        seen.add(e)
                        w, at = weight.get(e, (0.0, now))
                        weight[e] = (w * fade ** (now - at) + 1.0, now)
                        s = slot_of.get(e, -1)
                        if s >= 0:
                            last_use[s] = hit_stamp
                            acc[0] += 1
                            self.hits_profile += from_profile[s]
                        else:
                            acc[1] += 1
                            queue.append(e)
            self.clock += 1  # the admission after the decode: newer than every hit of it
            for (free, expert_in, slot_of, last_use, from_profile, _), queue, weight in zip(
                    self.state, queues, self.weights):
                done = 0
                for e in queue:
                    if done >= self.admit:
                        break
                    # a round never evicts what it admitted or what the ubatch used (stamped hit_stamp or later)
                    if free:
                        victim = free.pop(0)
                    else:
                        def held(c: int) -> tuple[float, int, int]:
                            w, at = weight.get(expert_in[c], (0.0, now))
                            return w * fade ** (now - at), last_use[c], c
                        older = [c for c in range(len(expert_in)) if last_use[c] < hit_stamp]
                        if not older:
                            break
                        victim = min(older, key=held)
                        del slot_of[expert_in[victim]]
                    expert_in[victim], slot_of[e], from_profile[victim], last_use[victim] = e, victim, False, self.clock
                    done += 1
                self.n_admit += done

    def result(self) -> PolicyResult:
        per_layer = {il: (st[5][0], st[5][1]) for il, st in zip(self.layers, self.state)}
        return PolicyResult(f"admit{self.admit}-lrfu", sum(h for h, _ in per_layer.values()), self.hits_profile,
                            sum(m for _, m in per_layer.values()), self.token_layers, self.all_in, 0, self.n_slots,
                            sum(len(st[2]) for st in self.state), per_layer, n_swap=self.n_admit, n_large=self.large)


def lrfu_replay(admit: int, half_life: float = LRFU_HALF_LIFE):
    """The factory of REPLAYS' signature for LRFU admission of ``admit`` experts per layer and decode (``sizes`` is
    not used: a simulator policy counts no bytes)."""
    def make(layers: Sequence[int], k: int, one_token: bool, slots: dict[int, int], n_expert: int,
             profile: Sequence[tuple[int, int]], sizes: Mapping[int, LayerShape] | None = None) -> Replay:
        return LrfuReplay(layers, k, slots, n_expert, profile, admit, half_life)
    return make
