"""``lru``: the upload mode (llama_moe_cache::lookup, and lookup_split for a ubatch that may select more
distinct experts than the layer has slots): per layer and ubatch of up to 32 tokens, the distinct experts the
slots hold are hits; each other one is a miss, uploaded into a free slot, else the least recently used slot the
ubatch does not use, or, once every slot serves the ubatch, computed on the CPU (a miss counted in ``n_cpu``,
the slots staying as they are). Nothing is refused. Two replays that count alike: slot by slot (any
ubatches), and every layer at once for one-token ubatches (a trace file's)."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..ranking import prefill_resident
from ..routes import Routes
from ..tracefiles import TraceRoutes
from .base import PolicyResult, Progress, Replay, _columns, drive, _looked_up

LRU_CHUNK_TOKENS = 1024  # tokens fed at a time (the results do not depend on it)


def lru(routes: Routes | TraceRoutes, slots: dict[int, int], n_expert: int, profile: Sequence[tuple[int, int]] = (),
        progress: Progress | None = None, chunk_tokens: int = LRU_CHUNK_TOKENS) -> PolicyResult:
    """The upload mode, slot for slot as the engine runs it (victims by slot order on ties, the split's misses
    on the CPU), from the engine's fill of the profile. One-token ubatches (a trace file's) are replayed with
    every layer at once (``LruTokensReplay``, the same counts); larger ones slot by slot."""
    replay = lru_replay(routes.layers, routes.k, routes.one_token_ubatches, slots, n_expert, profile)
    return drive(replay, routes, chunk_tokens, progress)


class LruLoopReplay(Replay):
    """``lru`` slot by slot: llama_moe_cache::lookup_split in Python, each layer its own slots and stamps (a
    ubatch that fits its slots never reaches the CPU branch: lookup's rule is the same)."""

    def __init__(self, layers: Sequence[int], k: int, slots: dict[int, int], n_expert: int,
                 profile: Sequence[tuple[int, int]]) -> None:
        self.k = k
        self.looked = _looked_up(layers, slots, n_expert)
        self.layers = [layers[j] for j in self.looked]
        filled = prefill_resident(profile, slots, n_expert)
        # per looked-up layer: slots, expert_in, slot_of, last_use, from_profile, [stamp, hits, misses, cpu]
        self.state = []
        for il in self.layers:
            n = slots[il]
            self.state.append((n, filled[il] + [-1] * (n - len(filled[il])), {e: s for s, e in enumerate(filled[il])},
                               [0] * n, [e >= 0 for e in filled[il]] + [False] * (n - len(filled[il])), [0, 0, 0, 0]))
        self.hits_profile = self.split_lookups = self.large = self.token_layers = self.all_in = 0
        self.n_slots = sum(slots[il] for il in self.layers)

    def feed(self, chunk: Routes) -> None:
        bounds = list(zip(chunk.starts[:-1].tolist(), chunk.starts[1:].tolist()))
        for j, (n, expert_in, slot_of, last_use, from_profile, acc) in zip(self.looked, self.state):
            counted, n_tokens = chunk.counted[:, j].tolist(), chunk.layer_tokens[:, j].tolist()
            stamp, lh, lm, lc = acc
            for u, (a, b) in enumerate(bounds):
                if not n_tokens[u]:
                    continue
                if not counted[u]:  # over 32 tokens: llama.cpp's path
                    self.large += 1
                    continue
                rows = [row for row in chunk.experts[a:b, j].tolist() if row[0] >= 0]
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
                on_cpu: set[int] = set()
                for e in ids:
                    if e in slot_of or e in on_cpu:
                        continue
                    lm += 1
                    victim = -1
                    for c in range(n):  # a free slot, else the least recently used one this ubatch does not use
                        if expert_in[c] < 0:
                            victim = c
                            break
                        if last_use[c] != stamp and (victim < 0 or last_use[c] < last_use[victim]):
                            victim = c
                    if victim < 0:  # every slot serves the ubatch: the CPU computes this one
                        on_cpu.add(e)
                        continue
                    if expert_in[victim] >= 0:
                        del slot_of[expert_in[victim]]
                    expert_in[victim], slot_of[e], from_profile[victim], last_use[victim] = e, victim, False, stamp
                if on_cpu:
                    lc += len(on_cpu)
                    self.split_lookups += 1
            acc[:] = stamp, lh, lm, lc

    def result(self) -> PolicyResult:
        per_layer = {il: (acc[1], acc[2]) for il, (*_, acc) in zip(self.layers, self.state)}
        cpu = {il: acc[3] for il, (*_, acc) in zip(self.layers, self.state)}
        return PolicyResult("lru", sum(h for h, _ in per_layer.values()), self.hits_profile,
                            sum(m for _, m in per_layer.values()), self.token_layers, self.all_in,
                            sum(cpu.values()), self.n_slots, sum(len(st[2]) for st in self.state), per_layer,
                            per_layer_cpu=cpu, n_split_lookups=self.split_lookups, n_large=self.large)


class LruTokensReplay(Replay):
    """``lru`` for one-token ubatches, every layer at once: per token, the hits of all layers in one lookup,
    then each layer's misses, in the token's order, into its slots in key order, key = (occupied, last use,
    slot) among the slots the token does not use: exactly the victims the slot-by-slot loop picks one after
    another (each victim it takes is then used by the token and drops out). A layer's misses beyond the slots
    left to it (fewer slots than the token's k experts) are computed on the CPU, as the engine's split. An id
    repeated within a token counts once, as in the loop."""

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
        self.rows = np.arange(n_l)[:, None]
        self.later = np.tril(np.ones((k, k), dtype=bool), -1)  # [i, j]: position j comes before position i
        self.hits = np.zeros(n_l, dtype=np.int64)
        self.misses = np.zeros(n_l, dtype=np.int64)
        self.cpu = np.zeros(n_l, dtype=np.int64)
        self.hits_profile = self.token_layers = self.all_in = self.split_lookups = 0
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
        self.token_layers += int(active.sum())
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
            mr, mc = np.nonzero(miss)  # by layer, then by place in the token's list: the engine's order
            if not mr.size:
                continue
            m = np.bincount(mr, minlength=n_l)
            self.misses += m
            lr = np.flatnonzero(m)  # the layers that miss
            lu = last_use[lr]
            key = np.where(expert_in[lr] < 0, slot_no - width, lu * width + slot_no)  # free first, then LRU
            key[(lu == stamp) | absent[lr]] = never
            free = (key != never).sum(axis=1)  # the victims each missing layer has: its other misses go to the CPU
            most = int(min(m[lr].max(), width))
            if most < width:
                part = np.argpartition(key, most - 1, axis=1)[:, :most]
                order = np.take_along_axis(part, np.argsort(np.take_along_axis(key, part, 1), axis=1), 1)
            else:
                order = np.argsort(key, axis=1)
            which = np.searchsorted(lr, mr)  # the row of `order` for each miss's layer
            rank = np.arange(mr.size) - (np.cumsum(m) - m)[mr]  # the r-th miss of its layer takes its r-th victim
            up = rank < free[which]
            if not up.all():
                self.cpu += np.bincount(mr[~up], minlength=n_l)
                self.split_lookups += int((m[lr] > free).sum())
                mr, mc, which, rank = mr[up], mc[up], which[up], rank[up]
            victim = order[which, rank]
            old = expert_in[mr, victim]
            gone = old >= 0
            slot_of[mr[gone], old[gone]] = -1
            new = e[mr, mc]
            expert_in[mr, victim], slot_of[mr, new] = new, victim
            from_profile[mr, victim], last_use[mr, victim] = False, stamp

    def result(self) -> PolicyResult:
        return PolicyResult("lru", int(self.hits.sum()), self.hits_profile, int(self.misses.sum()), self.token_layers,
                            self.all_in, int(self.cpu.sum()), int(self.n_slots.sum()),
                            int((self.expert_in >= 0).sum()),
                            {il: (int(h), int(m)) for il, h, m in zip(self.layers, self.hits, self.misses)},
                            per_layer_cpu={il: int(c) for il, c in zip(self.layers, self.cpu)},
                            n_split_lookups=self.split_lookups)


def lru_replay(layers: Sequence[int], k: int, one_token: bool, slots: dict[int, int], n_expert: int,
               profile: Sequence[tuple[int, int]]) -> Replay:
    """The fast replay for one-token ubatches, the slot-by-slot one for any others: the same counts."""
    return (LruTokensReplay if one_token else LruLoopReplay)(layers, k, slots, n_expert, profile)
