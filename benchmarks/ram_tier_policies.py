"""Held-out hit rates of a RAM tier of expert slots under several eviction policies, on the synthetic models'
calibrated routing, per document of the embedded corpus (leave one document out).

The tier: for a model bigger than RAM, each MoE layer keeps ``R`` expert slots in RAM (page-locked), filled from
the model file by direct disk reads; an expert the tier lacks is read from disk into a slot (evicting one), then
computed. Above it may sit a VRAM tier of ``V`` slots per layer, an LRU as upload mode's (every miss uploaded;
a token's experts never evict each other, touched in the router's order); its misses, in order, are the RAM
tier's stream. With no VRAM tier (``V = 0``) the stream is every selection. Each held-out document is replayed
as one stream of one-token decodes; per layer the tier sees, token by token, the distinct experts that reached
it (the lookups) and counts a hit for each it held before the token; the others are disk reads. A token's
experts never evict each other (so ``R`` is at least k), and every policy but belady reads every miss into a
slot (the compute needs it there).

Every slot holds one expert of its layer, and a layer's experts are all the same size, so equal slots per
layer are equal bytes: the policies are compared at equal slots.

Where each tier starts (the same for every policy, so that the comparison is about eviction): the VRAM tier
holds each layer's V experts most selected in the training documents (the other documents); the RAM tier holds
each layer's R experts most requested *at the tier* in the training documents (their streams through a VRAM
tier of V slots that starts empty: the selections themselves when V = 0), the most requested last to leave.

RAM policies (simulator-only: none is an engine mode; the code is here):

- ``lru``: the least recently used expert leaves (the default candidate);
- ``lfu``: LFU with dynamic aging (LFU-DA): an expert's priority is the tier's age plus its requests since it
  was read; the lowest priority leaves (ties: the least recent) and the tier's age becomes its priority, so
  that old counts stop protecting experts no longer requested;
- ``slru:P``: segmented LRU: an expert hit while held moves to a protected segment of P of the slots (its
  least recent goes back to probation when full); the least recent of probation leaves;
- ``arc``: ARC (Megiddo and Modha): recency and frequency lists with ghosts of the evicted that move the split
  between them (``arc.py``, shared with ``admit_policies.py``);
- ``lrfu:H``: the expert whose requests at the tier, each fading with a half-life of H tokens, weigh least
  leaves (its whole history counts, held or not; ties: the least recent);
- ``static+lru:P``: a share P of the slots pinned to the experts most requested at the tier in the training
  documents (never evicted), the other slots an LRU;
- ``belady``: the ceiling, knowing the future (``llama_moe.tools.routing.policies.belady``: with bypass, and
  starting with the experts needed first), on the same stream: no policy on it can hit more;
- ``lru-exclusive``: exclusive placement between the tiers, the RAM tier an LRU. An expert the VRAM tier
  misses is uploaded from its RAM slot if the RAM tier holds it (a RAM hit) and leaves the RAM tier (its slot
  is freed); else it is read from disk into a staging buffer and uploaded from there, not kept in RAM (a disk
  read). Every expert the VRAM tier evicts is copied down into the RAM tier (a device-to-host copy, no disk
  read), the most recent victim last to leave; a full RAM tier drops its least recent. No expert is in both
  tiers, so together they hold V + R distinct experts: the two LRUs are one LRU of V + R slots (the VRAM tier
  its most recent V). The staging buffer (one token's k experts, for the whole model) is not counted: under 1%
  of the tier's bytes at 25%. With no VRAM tier it is ``lru``. The RAM tier starts with its R experts most
  requested in training that the VRAM tier does not hold. Every other policy is inclusive: the RAM tier keeps
  what it read, whether the VRAM tier holds a copy or not (no back-invalidation), and does not see VRAM hits.

Reported per shape, VRAM size and RAM size: the RAM tier's hit rate (hits / lookups, lookups = the requests
that reach it: the VRAM tier's misses), disk reads per token (all layers), and each policy's hit rate minus
``lru``'s, paired by document; the intervals are 95% t intervals over the held-out documents.

``--stream`` replays the documents one after another instead, as one stream of one-token decodes (a long
conversation that changes topic), every tier starting empty and no policy trained (static+lru is left out);
the intervals are then over the documents' parts of the stream, belady's per part (from what the part needs
first).

    python benchmarks/ram_tier_policies.py [--stream] [--shapes qwen3-30b-a3b,gpt-oss-120b] [--pcts 25,50,75]
        [--vram-pcts 0,12.5] [--policies lru,lfu,slru:0.5,arc,lrfu:16,static+lru:0.5,belady,lru-exclusive]
"""
from __future__ import annotations

import argparse
import sys
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from llama_moe.tools.errors import ToolInputError
from llama_moe.tools.routing.policies.belady import belady_routes
from llama_moe.tools.routing.ranking import pair_counts
from llama_moe.tools.routing.routes import Routes, expert_dtype

from admit_policies import cell, shape_arguments, shape_documents  # the same corpus, documents and cells
from arc import Arc  # the one ARC of the studies (admit_policies' too)

DEFAULT_POLICIES = "lru,lfu,slru:0.5,arc,lrfu:16,static+lru:0.5,belady,lru-exclusive"
STATIC_SHARE = 0.5  # static+lru without a share: half the slots pinned


# ---- the VRAM tier above: its misses are the RAM tier's stream

@dataclass(frozen=True)
class TierStream:
    """A document's requests to the RAM tier: ``rows[j][t]``, the experts token t missed in layer j's VRAM tier
    (in the router's order; every selection with no VRAM tier); ``victims[j][t]``, what the VRAM tier evicted
    for them, least recent first; ``vram_hits``: the VRAM tier's hits, all layers; ``vram_slots``: its slots per
    layer (0: none)."""

    n_expert: int
    vram_slots: int
    rows: list[list[list[int]]]
    victims: list[list[list[int]]]
    vram_hits: int

    @property
    def n_tokens(self) -> int:
        return len(self.rows[0]) if self.rows else 0

    @property
    def lookups(self) -> int:
        return sum(len(r) for col in self.rows for r in col)

    def counts(self) -> np.ndarray:
        """[n_layers, n_expert]: how often each expert reached the RAM tier."""
        out = np.zeros((len(self.rows), self.n_expert), dtype=np.int64)
        for j, col in enumerate(self.rows):
            flat = [e for r in col for e in r]
            if flat:
                out[j] = np.bincount(flat, minlength=self.n_expert)
        return out

    def routes(self) -> Routes:
        """The stream as ``Routes`` of one-token decodes, each row padded with -1 (a token whose experts all hit
        VRAM is no lookup), for the library's belady."""
        n_l, n = len(self.rows), self.n_tokens
        width = max((len(r) for col in self.rows for r in col), default=1) or 1
        x = np.full((n, n_l, width), -1, dtype=expert_dtype(self.n_expert))
        for j, col in enumerate(self.rows):
            for t, r in enumerate(col):
                x[t, j, :len(r)] = r
        return Routes(tuple(range(n_l)), x, np.arange(n + 1, dtype=np.int64))


def vram_tier(x: np.ndarray, n_slots: int, fills: Sequence[Sequence[int]], n_expert: int) -> TierStream:
    """The RAM tier's stream under a VRAM LRU of ``n_slots`` per layer over ``x`` [n_tokens, n_layers, k], each
    layer starting with ``fills[j]`` (hottest first, the hottest last to leave); ``n_slots = 0``: no VRAM tier."""
    n_l = x.shape[1]
    if n_slots == 0:
        cols = [x[:, j, :].tolist() for j in range(n_l)]
        return TierStream(n_expert, 0, [[[e for e in r if e >= 0] for r in col] for col in cols],
                          [[[] for _ in col] for col in cols], 0)
    if n_slots < x.shape[2]:
        raise ToolInputError(f"a VRAM tier of {n_slots} slots per layer cannot hold one token's {x.shape[2]} experts")
    rows, victims, hits = [], [], 0
    for j in range(n_l):
        cache: OrderedDict[int, None] = OrderedDict((e, None) for e in reversed(list(fills[j])[:n_slots]))
        r_col, v_col = [], []
        for row in x[:, j, :].tolist():
            miss = []
            for e in row:
                if e < 0:
                    continue
                if e in cache:
                    hits += 1
                    cache.move_to_end(e)
                else:
                    miss.append(e)
                    cache[e] = None
            out = []
            while len(cache) > n_slots:  # the token's experts are the most recent: never one of them
                out.append(cache.popitem(last=False)[0])
            r_col.append(miss)
            v_col.append(out)
        rows.append(r_col)
        victims.append(v_col)
    return TierStream(n_expert, n_slots, rows, victims, hits)


# ---- the RAM tier's policies: one layer each; ``token(row, t)`` returns the hits, reads the misses

class TierPolicy:
    """One layer's RAM tier of ``n_slots``, starting with ``fill`` (hottest first, the hottest last to leave).
    ``token(row, t)``: token ``t``'s distinct requests; counts the hits (held before the token), reads every
    miss into a slot, never evicting one of the token's own experts."""

    def __init__(self, n_slots: int, k: int) -> None:
        if n_slots < k:
            raise ToolInputError(f"a RAM tier of {n_slots} slots per layer cannot hold one token's {k} experts")
        self.n = n_slots

    def token(self, row: list[int], t: int) -> int:
        raise NotImplementedError

    def held(self) -> set[int]:
        raise NotImplementedError


class Lru(TierPolicy):
    def __init__(self, n_slots: int, k: int, fill: Sequence[int]) -> None:
        super().__init__(n_slots, k)
        self.od: OrderedDict[int, None] = OrderedDict((e, None) for e in reversed(list(fill)[:n_slots]))

    def token(self, row: list[int], t: int) -> int:
        od, hits = self.od, 0
        for e in row:
            if e in od:
                hits += 1
                od.move_to_end(e)
            else:
                od[e] = None
        while len(od) > self.n:  # the token's experts are the most recent: never one of them
            od.popitem(last=False)
        return hits

    def held(self) -> set[int]:
        return set(self.od)


class LfuAging(TierPolicy):
    """LFU-DA: priority = the tier's age when last requested + requests since read; the age rises to each
    victim's priority."""

    def __init__(self, n_slots: int, k: int, fill: Sequence[int]) -> None:
        super().__init__(n_slots, k)
        self.age = 0.0
        self.clock = 0
        start = list(fill)[:n_slots]
        # expert -> [priority, requests since read, last token's clock]; the fill as read once, hottest latest
        self.key: dict[int, list[float]] = {e: [1.0, 1.0, -i - 1] for i, e in enumerate(start)}

    def token(self, row: list[int], t: int) -> int:
        self.clock += 1
        key, hits, new = self.key, 0, []
        for e in row:
            k = key.get(e)
            if k is None:
                new.append(e)
            else:
                hits += 1
                k[1] += 1
                k[0], k[2] = self.age + k[1], self.clock
        for e in new:
            if len(key) >= self.n:
                victim = min((c for c in key if key[c][2] != self.clock), key=lambda c: (key[c][0], key[c][2]))
                self.age = key.pop(victim)[0]
            key[e] = [self.age + 1.0, 1.0, self.clock]
        return hits

    def held(self) -> set[int]:
        return set(self.key)


class Slru(TierPolicy):
    def __init__(self, n_slots: int, k: int, fill: Sequence[int], share: float) -> None:
        super().__init__(n_slots, k)
        if not 0 < share < 1:
            raise ToolInputError(f"slru's protected share must be in (0, 1), got {share}")
        self.cap = max(1, round(share * n_slots))
        self.probation: OrderedDict[int, None] = OrderedDict((e, None) for e in reversed(list(fill)[:n_slots]))
        self.protected: OrderedDict[int, None] = OrderedDict()

    def token(self, row: list[int], t: int) -> int:
        prob, prot, hits, new = self.probation, self.protected, 0, []
        for e in row:
            if e in prot:
                hits += 1
                prot.move_to_end(e)
            elif e in prob:
                hits += 1
                del prob[e]
                prot[e] = None
                if len(prot) > self.cap:
                    prob[prot.popitem(last=False)[0]] = None
            else:
                new.append(e)
        for e in new:
            prob[e] = None
        mine = set(row)
        while len(prob) + len(prot) > self.n:
            victim = next((c for c in prob if c not in mine), None)
            if victim is None:
                del prot[next(c for c in prot if c not in mine)]
            else:
                del prob[victim]
        return hits

    def held(self) -> set[int]:
        return set(self.probation) | set(self.protected)


class ArcTier(TierPolicy):
    """ARC (``arc.Arc``), a token's own experts never evicted for another of them; the fill starts in T1, the
    hottest last to leave."""

    def __init__(self, n_slots: int, k: int, fill: Sequence[int]) -> None:
        super().__init__(n_slots, k)
        self.arc = Arc(n_slots, reversed(list(fill)[:n_slots]), protect=True)

    def token(self, row: list[int], t: int) -> int:
        return self.arc.token(row)[0]

    def held(self) -> set[int]:
        return self.arc.held()


class Lrfu(TierPolicy):
    """Each request at token t adds 2 ** (t / H) to its expert's weight: all weights fade alike, so comparing
    these sums is comparing the faded weights (rescaled now and then, so that no float overflows)."""

    def __init__(self, n_slots: int, k: int, fill: Sequence[int], half_life: float) -> None:
        super().__init__(n_slots, k)
        if not half_life > 0:
            raise ToolInputError(f"lrfu's half-life must be > 0 tokens, got {half_life}")
        self.h = half_life
        self.base = 0
        self.weight: dict[int, float] = {}
        self.clock = 0
        self.last: dict[int, int] = {e: -i - 1 for i, e in enumerate(list(fill)[:n_slots])}  # held -> last clock

    def token(self, row: list[int], t: int) -> int:
        if t - self.base > 256 * self.h:
            scale = 2.0 ** (-(t - self.base) / self.h)
            self.weight = {e: w * scale for e, w in self.weight.items()}
            self.base = t
        self.clock += 1
        add = 2.0 ** ((t - self.base) / self.h)
        last, weight, hits, new = self.last, self.weight, 0, []
        for e in row:
            weight[e] = weight.get(e, 0.0) + add
            if e in last:
                hits += 1
                last[e] = self.clock
            else:
                new.append(e)
        for e in new:
            if len(last) >= self.n:
                victim = min((c for c in last if last[c] != self.clock), key=lambda c: (weight.get(c, 0.0), last[c]))
                del last[victim]
            last[e] = self.clock
        return hits

    def held(self) -> set[int]:
        return set(self.last)


class StaticLru(TierPolicy):
    """``pinned`` (the tier's most requested experts in training) never leave; the other slots are an LRU."""

    def __init__(self, n_slots: int, k: int, fill: Sequence[int], pinned: Sequence[int], share: float) -> None:
        super().__init__(n_slots, k)
        if not 0 <= share < 1:
            raise ToolInputError(f"static+lru's pinned share must be in [0, 1), got {share}")
        self.pin = set(list(pinned)[:round(share * n_slots)])
        if n_slots - len(self.pin) < k:
            raise ToolInputError(f"static+lru:{share:g} pins {len(self.pin)} of {n_slots} slots, leaving fewer than "
                                 f"one token's {k} experts to its LRU")
        self.lru = Lru(n_slots - len(self.pin), k, [e for e in fill if e not in self.pin])

    def token(self, row: list[int], t: int) -> int:
        pinned = sum(e in self.pin for e in row)
        return pinned + self.lru.token([e for e in row if e not in self.pin], t)

    def held(self) -> set[int]:
        return self.pin | self.lru.held()


class ExclusiveLru(TierPolicy):
    """The RAM tier as the VRAM tier's victim cache: ``token(row, t, victims)`` counts the requests it holds
    (they move up and leave), then takes the VRAM tier's victims of the token, least recent first."""

    def __init__(self, n_slots: int, k: int, fill: Sequence[int]) -> None:
        super().__init__(n_slots, k)
        self.od: OrderedDict[int, None] = OrderedDict((e, None) for e in reversed(list(fill)[:n_slots]))

    def token(self, row: list[int], t: int, victims: Sequence[int] = ()) -> int:
        od, hits = self.od, 0
        for e in row:
            if e in od:
                hits += 1
                del od[e]
        for v in victims:
            od[v] = None
        while len(od) > self.n:
            od.popitem(last=False)
        return hits

    def held(self) -> set[int]:
        return set(self.od)


def parse_policy(spec: str) -> tuple[str, float]:
    """(kind, parameter) of a policy's name: ``slru:0.5``, ``lrfu:16``, ``static+lru:0.5``, ``lru`` ..."""
    kind, _, param = spec.partition(":")
    defaults = {"slru": 0.5, "lrfu": 16.0, "static+lru": STATIC_SHARE}
    if kind not in ("lru", "lfu", "arc", "belady", "lru-exclusive", *defaults) or (param and kind not in defaults):
        raise ToolInputError(f"unknown RAM tier policy {spec!r}; one of lru, lfu, slru:P, arc, lrfu:H, static+lru:P, "
                             "belady, lru-exclusive")
    try:
        return kind, float(param) if param else defaults.get(kind, 0.0)
    except ValueError:
        raise ToolInputError(f"{spec!r}: {param!r} is not a number") from None


def make_policy(spec: str, n_slots: int, k: int, fill: Sequence[int], pinned: Sequence[int] = ()) -> TierPolicy:
    """One layer's tier of a policy by name (not belady, which needs the whole stream)."""
    kind, param = parse_policy(spec)
    if kind == "lru":
        return Lru(n_slots, k, fill)
    if kind == "lfu":
        return LfuAging(n_slots, k, fill)
    if kind == "slru":
        return Slru(n_slots, k, fill, param)
    if kind == "arc":
        return ArcTier(n_slots, k, fill)
    if kind == "lrfu":
        return Lrfu(n_slots, k, fill, param)
    if kind == "static+lru":
        return StaticLru(n_slots, k, fill, pinned, param)
    if kind == "lru-exclusive":
        return ExclusiveLru(n_slots, k, fill)
    raise ToolInputError(f"{spec!r} needs the whole stream: replay it with tier_replay")


# ---- one held-out fold

@dataclass(frozen=True)
class TierCount:
    """A policy's RAM tier over one document: hits and lookups (the requests that reached it)."""

    policy: str
    hits: int
    lookups: int

    @property
    def disk_reads(self) -> int:
        return self.lookups - self.hits

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 1.0


@dataclass(frozen=True)
class FoldResult:
    """One held-out document at one VRAM size: its tokens, the VRAM tier's hits and lookups, and each (RAM
    slots per layer, policy)'s count."""

    n_tokens: int
    vram_hits: int
    vram_lookups: int
    tiers: dict[tuple[int, str], TierCount] = field(default_factory=dict)


def ranking(counts: np.ndarray) -> list[list[int]]:
    """Per layer, the experts with a count, most counted first (ties: the lower id)."""
    out = []
    for row in counts:
        order = np.lexsort((np.arange(len(row)), -row))
        out.append([int(e) for e in order if row[e] > 0])
    return out


def document_counts(x: np.ndarray, vram_slots: int, n_expert: int) -> tuple[np.ndarray, np.ndarray]:
    """A training document's counts [n_layers, n_expert]: its selections, and its requests to the RAM tier
    (through a VRAM tier of ``vram_slots`` that starts empty)."""
    n_l = x.shape[1]
    raw = pair_counts(Routes(tuple(range(n_l)), x, np.arange(len(x) + 1, dtype=np.int64)), n_expert)
    if vram_slots == 0:
        return raw, raw
    return raw, vram_tier(x, vram_slots, [[]] * n_l, n_expert).counts()


def tier_hits(spec: str, stream: TierStream, n_slots: int, k: int, fills: Sequence[Sequence[int]],
              pinned: Sequence[Sequence[int]] = ()) -> np.ndarray:
    """[n_tokens]: a policy's RAM tier hits per token (all layers), ``n_slots`` per layer over ``stream``, each
    layer starting with ``fills[j]`` (``pinned[j]``: static+lru's ranking). Not belady: ``tier_replay``."""
    hits = [0] * stream.n_tokens
    exclusive = spec == "lru-exclusive" and stream.vram_slots > 0
    kind = "lru" if spec == "lru-exclusive" and not exclusive else spec  # nothing above to be exclusive of
    for j, col in enumerate(stream.rows):
        tier = make_policy(kind, n_slots, k, fills[j], pinned[j] if pinned else ())
        if exclusive:
            for t, (row, out) in enumerate(zip(col, stream.victims[j])):
                hits[t] += tier.token(row, t, out)
        else:
            for t, row in enumerate(col):
                if row:
                    hits[t] += tier.token(row, t)
    return np.array(hits, dtype=np.int64)


def tier_replay(spec: str, stream: TierStream, n_slots: int, k: int, fills: Sequence[Sequence[int]],
                pinned: Sequence[Sequence[int]] = ()) -> TierCount:
    """A policy's RAM tier of ``n_slots`` per layer over ``stream``, each layer starting with ``fills[j]``
    (``pinned[j]``: static+lru's ranking); belady starts with what it needs first."""
    lookups = stream.lookups
    if parse_policy(spec)[0] != "belady":
        return TierCount(spec, int(tier_hits(spec, stream, n_slots, k, fills, pinned).sum()), lookups)
    if n_slots < k:
        raise ToolInputError(f"a RAM tier of {n_slots} slots per layer cannot hold one token's {k} experts")
    if n_slots >= stream.n_expert:
        return TierCount(spec, lookups, lookups)
    r = belady_routes(stream.routes(), {j: n_slots for j in range(len(stream.rows))}, stream.n_expert)
    if r.n_hit + r.n_miss != lookups:
        raise AssertionError(f"belady looked up {r.n_hit + r.n_miss} requests of {lookups}")
    return TierCount(spec, r.n_hit, lookups)


def held_out_fold(x: np.ndarray, train_raw: np.ndarray, train_tier: np.ndarray, vram_slots: int,
                  ram_slots: Sequence[int], policies: Sequence[str]) -> FoldResult:
    """The document ``x`` [n_tokens, n_layers, k] replayed with tiers started from the training documents'
    counts (``train_raw``: selections, for the VRAM tier; ``train_tier``: requests at the RAM tier), at each RAM
    size, by each policy."""
    k = x.shape[2]
    n_expert = train_raw.shape[1]
    vram_fill = [r[:vram_slots] for r in ranking(train_raw)]
    stream = vram_tier(x, vram_slots, vram_fill, n_expert)
    tier_rank = ranking(train_tier)
    out: dict[tuple[int, str], TierCount] = {}
    for n in ram_slots:
        for spec in policies:
            if spec == "lru-exclusive":
                fills = [[e for e in r if e not in held] for r, held in zip(tier_rank, map(set, vram_fill))]
            else:
                fills = tier_rank
            out[n, spec] = tier_replay(spec, stream, n, k, fills, tier_rank)
    return FoldResult(stream.n_tokens, stream.vram_hits, int((x >= 0).sum()), out)


def stream_parts(docs: Sequence[np.ndarray], vram_slots: int, ram_slots: Sequence[int], policies: Sequence[str],
                 n_expert: int) -> list[FoldResult]:
    """The documents one after another as one stream, every tier starting empty (nothing trained: static+lru
    is left out), counted per document's part; belady per part, from what the part needs first."""
    x = np.concatenate(docs)
    k, n_l = x.shape[2], x.shape[1]
    cold = [[] for _ in range(n_l)]
    stream = vram_tier(x, vram_slots, cold, n_expert)
    edges = np.concatenate(([0], np.cumsum([len(d) for d in docs])))
    reach = np.array([sum(len(col[t]) for col in stream.rows) for t in range(len(x))], dtype=np.int64)
    hits = {(n, s): tier_hits(s, stream, n, k, cold) for n in ram_slots for s in policies
            if parse_policy(s)[0] not in ("belady", "static+lru")}
    out = []
    for a, b in zip(edges[:-1], edges[1:]):
        part = TierStream(n_expert, vram_slots, [col[a:b] for col in stream.rows],
                          [col[a:b] for col in stream.victims], 0)
        lookups = int(reach[a:b].sum())
        tiers = {key: TierCount(key[1], int(h[a:b].sum()), lookups) for key, h in hits.items()}
        if "belady" in policies:
            tiers.update({(n, "belady"): tier_replay("belady", part, n, k, cold) for n in ram_slots})
        selected = int((x[a:b] >= 0).sum())
        out.append(FoldResult(int(b - a), selected - lookups, selected, tiers))
    return out


def held_out(docs: Sequence[np.ndarray], vram_slots: int, ram_slots: Sequence[int], policies: Sequence[str],
             n_expert: int) -> list[FoldResult]:
    """Every document held out in turn, its tiers started from the other documents' counts."""
    counts = [document_counts(x, vram_slots, n_expert) for x in docs]
    folds = []
    for i, x in enumerate(docs):
        train_raw = sum(c[0] for j, c in enumerate(counts) if j != i)
        train_tier = sum(c[1] for j, c in enumerate(counts) if j != i)
        folds.append(held_out_fold(x, train_raw, train_tier, vram_slots, ram_slots, policies))
        print(f"  VRAM {vram_slots}: document {i + 1} of {len(docs)} done", file=sys.stderr, flush=True)
    return folds


# ---- the tables

def print_tables(rows: Sequence[tuple[str, list[FoldResult]]], ram: Sequence[tuple[float, int]], n_expert: int,
                 policies: Sequence[str], unit: str) -> None:
    """The hit rates, the disk reads per token and the differences to lru, each cell a mean over ``unit``s (the
    held-out documents, or the stream's parts) with its 95% t interval."""
    head = "| VRAM tier (LRU) | RAM tier | "
    print("\nRAM tier hit rate (hits / requests reaching it):\n")
    print(head + "VRAM hit rate | " + " | ".join(policies) + " |")
    print("|---|---|---|" + "---|" * len(policies))
    for vram, folds in rows:
        vr = cell([f.vram_hits / f.vram_lookups for f in folds]) if vram != "none" else "-"
        for p, n in ram:
            print(f"| {vram} | {n} of {n_expert} ({p:g}%) | {vr} | "
                  + " | ".join(cell([f.tiers[n, s].hit_rate for f in folds]) for s in policies) + " |")
    print("\ndisk reads per token (all layers):\n")
    print(head + "requests reaching RAM per token | " + " | ".join(policies) + " |")
    print("|---|---|---|" + "---|" * len(policies))
    for vram, folds in rows:
        for p, n in ram:
            reach = cell([f.tiers[n, policies[0]].lookups / f.n_tokens for f in folds], 1)
            print(f"| {vram} | {n} of {n_expert} ({p:g}%) | {reach} | "
                  + " | ".join(cell([f.tiers[n, s].disk_reads / f.n_tokens for f in folds], 2) for s in policies)
                  + " |")
    if "lru" in policies:
        others = [s for s in policies if s != "lru"]
        print(f"\nhit rate minus lru's, points, paired by {unit}:\n")
        print(head + " | ".join(others) + " |")
        print("|---|---|" + "---|" * len(others))
        for vram, folds in rows:
            for p, n in ram:
                print(f"| {vram} | {n} of {n_expert} ({p:g}%) | " + " | ".join(
                    cell([100 * (f.tiers[n, s].hit_rate - f.tiers[n, 'lru'].hit_rate) for f in folds], 2)
                    for s in others) + " |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shape_arguments(ap, pcts="25,50,75")
    ap.add_argument("--vram-pcts", default="0,12.5", help="VRAM tier slots per layer, in percent of its experts (0: none)")
    ap.add_argument("--policies", default=DEFAULT_POLICIES)
    ap.add_argument("--stream", action="store_true",
                    help="the documents one after another as one stream, every tier starting empty, instead of "
                         "held out (static+lru, which needs training, is left out)")
    a = ap.parse_args()
    policies = a.policies.split(",")
    for spec in policies:
        parse_policy(spec)
    if a.stream:
        policies = [s for s in policies if parse_policy(s)[0] != "static+lru"]
    calibrated = {"qwen3-30b-a3b": "calibrated"}
    for name in a.shapes.split(","):
        t0 = time.monotonic()
        n_layer, n_expert, k, grouped = shape_documents(name, a.seed)
        docs = [np.concatenate(d) for d in grouped]
        print(f"Routing: `{name}`, {calibrated.get(name, 'not calibrated')} (\"Routing\", at the top). "
              "Compared at equal slots per layer, which are equal bytes (every slot holds one expert of its layer).")
        if a.stream:
            print(f"One stream of the {len(docs)} documents, every tier starting empty; intervals over the "
                  "documents' parts of it.")
        ram = [(p, max(k, round(n_expert * p / 100))) for p in (float(x) for x in a.pcts.split(","))]
        rows = []
        for vp in (float(x) for x in a.vram_pcts.split(",")):
            v = 0 if vp == 0 else max(k, round(n_expert * vp / 100))
            run = stream_parts if a.stream else held_out
            rows.append(("none" if v == 0 else f"{v} of {n_expert} ({vp:g}%)",
                         run(docs, v, [n for _, n in ram], policies, n_expert)))
        print_tables(rows, ram, n_expert, policies, "document's part" if a.stream else "held-out document")
        print(f"\n{name}: {time.monotonic() - t0:.0f} s", flush=True)
    return 0

if __name__ == "__main__":
    sys.exit(main())
