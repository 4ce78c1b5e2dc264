"""Cache policies replayed over routing, counting like the engine: per layer, hits and misses of the distinct
experts of each ubatch the cache looks up (up to ``llama_moe.policy_replay.max_ubatch()`` tokens); layers held
whole need no lookups and are not counted.

The policies the engine runs are replayed by the engine itself (``policies.engine``: the cache's own policy
objects, fed the routing as its cache is fed it, through ``llama_moe.policy_replay``):

- ``lru``: the upload mode: a miss is uploaded into a free slot, else the least recently used slot the ubatch
  does not use; once every slot serves the ubatch (more distinct experts than slots: several tokens at once, or
  fewer slots than k), its remaining misses are computed on the CPU, counted in ``n_cpu``.
- ``static``: the hybrid without adaptation: the profile's experts stay, the others run on the CPU.
- ``adaptive``: the hybrid that swaps hot experts in (docs/cache.md, "Adaptive").
- ``admit1``, ``admit2``, ``admit4``, ``admit8``: the hybrid with admission of that many missed experts per
  layer and decode (``--moe-cache-admit N``); not in the default set.
- ``admitN-repartR`` (R in ``engine.REPARTITION_PERIODS``): the same admission, moving slots between layers every
  R decodes (``--moe-cache-repartition R``); not in the default set.

Simulator-only policies, which the engine does not run, stay in Python:

- ``belady``: per layer, the most hits a cache of that size could have, knowing the future (the ceiling).
- ``admit1-lrfu`` ... ``admit8-lrfu``: admission with victims by recency and frequency together
  (``lrfu.LRFU_HALF_LIFE``); not in the default set.

Every policy also reports h_layer: the share of looked-up (layer, token) pairs whose k experts were all
resident when the ubatch was looked up (the tokens that need no CPU or upload work in that layer).

The hit rate is hits / (hits + misses), every distinct selection counted: the misses the CPU computes (upload
mode's split, the hybrid's misses) are in the denominator, so that a cache too small for its ubatches (upload
mode at fewer slots than k) never reads as a good one. Nothing is refused: no policy has a refused count.
With nothing looked up at all (every layer held whole) there is no hit rate: ``hit_rate``, ``h_layer`` and
``layer_hit_rate`` are None, and the reports print "n/a".

Every policy but belady is a ``Replay``: a state fed the routing a chunk of whole ubatches at a time, in
order, from a ``Routes`` in memory or from trace files as they are read (``TraceRoutes``); its memory is
its state (slots and heats per layer) and the temporaries of a chunk, whatever the routing's length, and
``replay_jobs`` feeds many of them (sizes, policies, folds) from one pass over the files. Belady needs the
future: it holds a layer's ids and their next uses (5 bytes per id of the layer), and reads trace files
once per group of layers. Every policy takes ``progress(done, total)`` and ``chunk_tokens`` (the results do not
depend on it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

from ....policy_replay import LayerShape
from ..ranking import CHUNK_TOKENS
from ..routes import Routes
from ..tracefiles import TraceRoutes
from .base import Meter, PolicyResult, Progress, Replay, _looked_up, drive, merge_results
from .belady import belady_routes
from .engine import ENGINE_CHUNK_TOKENS, ENGINE_POLICIES, REPARTITION_PERIODS, EngineReplay, engine_replay
from .lrfu import LRFU_CHUNK_TOKENS, LRFU_HALF_LIFE, LrfuReplay, lrfu_replay

# (layers, k, one_token, slots, n_expert, profile[, sizes=...]) -> Replay; ``sizes`` as ``replayer`` takes it
ReplayFactory = Callable[..., Replay]

# The one dispatch table: each policy fed the routing in order, by name, with the tokens it is fed at a time
# (the results do not depend on it). Belady needs the future and is no Replay (``belady``).
REPLAYS: dict[str, tuple[ReplayFactory, int]] = {
    **{name: (engine_replay(name), ENGINE_CHUNK_TOKENS) for name in ENGINE_POLICIES},
    **{f"admit{n}-lrfu": (lrfu_replay(n), LRFU_CHUNK_TOKENS) for n in (1, 2, 4, 8)},
}
POLICIES = ("lru", "static", "adaptive", "belady")  # the default set
ALL_POLICIES = (*REPLAYS, "belady")

# What each policy is, in a few words (the reports' column beside the figures): every name of ALL_POLICIES.
DESCRIPTIONS: dict[str, str] = {
    "lru": "upload mode, LRU",
    "static": "hybrid, the profile's experts stay",
    "adaptive": "hybrid, hot experts swapped in",
    "belady": "ceiling: knows the future (simulator only)",
    **{f"admit{n}": f"hybrid admitting {n} miss{'es' if n > 1 else ''} per layer and decode" for n in (1, 2, 4, 8)},
    **{f"admit{n}-lrfu": f"hybrid admitting {n} per layer and decode, victims by recency and frequency (simulator only)"
       for n in (1, 2, 4, 8)},
    **{f"admit{n}-repart{r}": f"hybrid admitting {n} per layer and decode, slots moved between layers every {r} "
       "decodes" for n in (1, 2, 4, 8) for r in REPARTITION_PERIODS},
}


def describe(name: str) -> str:
    """What the policy ``name`` (one of ALL_POLICIES) is, in a few words."""
    if name not in DESCRIPTIONS:
        raise _unknown(name)
    return DESCRIPTIONS[name]

BELADY_GROUP_BYTES = 16 << 20  # a streamed belady reads as many layers' ids per pass as fit in this (at least one)


def _unknown(name: str) -> ValueError:
    return ValueError(f"unknown policy {name!r}; one of {', '.join(ALL_POLICIES)}")


def replayer(name: str, layers: Sequence[int], k: int, one_token: bool, slots: dict[int, int], n_expert: int,
             profile: Sequence[tuple[int, int]], sizes: Mapping[int, LayerShape] | None = None,
             ram_slots: Mapping[int, int] | None = None) -> Replay:
    """The ``Replay`` of one of POLICIES but belady (which needs the future), started from the profile.
    ``sizes`` (il -> ``budget.layer_shapes``' shape): the engine's policies count their bytes as the engine does
    (``PolicyResult.n_bytes_upload``, ``n_bytes_cpu``)."""
    if name not in REPLAYS:
        raise _unknown(name)
    if ram_slots is not None:
        if name not in ENGINE_POLICIES:
            raise ValueError(f"policy {name!r} is the simulator's own: a RAM tier under it is the engine's policies' alone")
        return REPLAYS[name][0](layers, k, one_token, slots, n_expert, profile, sizes=sizes, ram_slots=ram_slots)
    return REPLAYS[name][0](layers, k, one_token, slots, n_expert, profile, sizes=sizes)


def run_policy(name: str, routes: Routes | TraceRoutes, slots: dict[int, int], n_expert: int,
               profile: Sequence[tuple[int, int]], progress: Progress | None = None) -> PolicyResult:
    """One of POLICIES by name; the profile fills lru, static and adaptive at the start (belady needs none).
    ``progress(done, total)`` as the replay goes."""
    if name == "belady":
        return belady(routes, slots, n_expert, progress)
    replay = replayer(name, routes.layers, routes.k, routes.one_token_ubatches, slots, n_expert, profile)
    return drive(replay, routes, REPLAYS[name][1], progress)


def belady(routes: Routes | TraceRoutes, slots: dict[int, int], n_expert: int, progress: Progress | None = None,
           chunk_tokens: int = CHUNK_TOKENS) -> PolicyResult:
    """The ceiling: per layer, Belady's rule with bypass over the lookups' distinct experts. On a miss with
    the slots full, the expert needed furthest in the future (the newcomer included: then it is not
    admitted) leaves. Each layer starts holding the experts it will need first, as a perfect profile would.
    No policy that loads an expert when it is selected (lru, static) can hit more; one that loads ahead of
    selection (adaptive's swaps) could pass it, by at most one hit per expert it loads. Knowing the future
    takes a layer's lookups at once: its ids and each one's next use (numpy, 5 bytes per id of the layer at
    int8 ids), replayed a chunk at a time. Streamed trace files are read once per group of layers
    (``BELADY_GROUP_BYTES`` of their ids, or one layer)."""
    if isinstance(routes, TraceRoutes):
        return replay_jobs(routes, [Job(0, routes.n_tokens, "belady", slots)], n_expert, progress, chunk_tokens)[0]
    return belady_routes(routes, slots, n_expert, progress, chunk_tokens)


@dataclass(frozen=True)
class Job:
    """One replay: ``policy`` over tokens ``a:b`` of a routing, with ``slots``, from ``profile``; ``ram_slots``:
    three tiers, a RAM tier of that many slots a layer under the cache (the engine's policies only)."""

    a: int
    b: int
    policy: str
    slots: dict[int, int]
    profile: Sequence[tuple[int, int]] = ()
    ram_slots: Mapping[int, int] | None = None


def replay_jobs(routes: Routes | TraceRoutes, jobs: Sequence[Job], n_expert: int, progress: Progress | None = None,
                chunk_tokens: int = CHUNK_TOKENS, sizes: Mapping[int, LayerShape] | None = None) -> list[PolicyResult]:
    """Every job's result, as ``run_policy(job.policy, routes.tokens(job.a, job.b), ...)`` gives it (``sizes``: the
    layers' shapes, for the engine's policies to count their bytes, as ``replayer`` takes them). A routing
    in memory replays its jobs one after another. Trace files are read once for all the jobs but belady's,
    each fed the chunks of its tokens (the chunks are cut at every job's edges), and once per group of layers
    for belady's (as many layers' ids of the tokens they span as fit in ``BELADY_GROUP_BYTES``, at least one).
    Memory: the replays' states, a chunk, and for belady a group of layers and one layer's next uses."""
    results: list[PolicyResult | None] = [None] * len(jobs)
    feeding = [i for i, job in enumerate(jobs) if job.policy != "belady"]
    future = [i for i, job in enumerate(jobs) if job.policy == "belady"]
    if isinstance(routes, Routes):
        meter = Meter(sum(jobs[i].b - jobs[i].a for i in range(len(jobs))), progress)
        for i, job in enumerate(jobs):
            part = routes if (job.a, job.b) == (0, routes.n_tokens) else routes.tokens(job.a, job.b)
            tick = meter.part(job.b - job.a)
            if job.policy == "belady":
                results[i] = belady_routes(part, job.slots, n_expert, tick, chunk_tokens)
            else:
                replay = replayer(job.policy, part.layers, part.k, part.one_token_ubatches, job.slots, n_expert, job.profile,
                                  sizes, job.ram_slots)
                results[i] = drive(replay, part, chunk_tokens, tick)
        return results  # type: ignore[return-value]
    n_layers = len(routes.layers)
    groups: list[list[int]] = []
    if future:
        lo, hi = min(jobs[i].a for i in future), max(jobs[i].b for i in future)
        looked = sorted({j for i in future for j in _looked_up(routes.layers, jobs[i].slots, n_expert)})
        per_layer = max(1, (hi - lo) * routes.k * routes.dtype.itemsize)
        size = max(1, BELADY_GROUP_BYTES // per_layer)
        groups = [looked[g:g + size] for g in range(0, len(looked), size)]
    span = [jobs[i].b - jobs[i].a for i in range(len(jobs))]
    # weights: a pass feeding the replays; per group of layers, reading it and replaying its layers
    feed_weight = sum(span[i] for i in feeding)
    group_weights = [(hi - lo) // 4 + sum(span[i] * len(g) // n_layers for i in future) for g in groups] if future else []
    meter = Meter(feed_weight + sum(group_weights), progress)
    if feeding:
        a0, b0 = min(jobs[i].a for i in feeding), max(jobs[i].b for i in feeding)
        source = routes if (a0, b0) == (0, routes.n_tokens) else routes.tokens(a0, b0)
        replays = {i: replayer(jobs[i].policy, routes.layers, routes.k, True, jobs[i].slots, n_expert, jobs[i].profile,
                               sizes, jobs[i].ram_slots) for i in feeding}
        cuts = sorted({x - a0 for i in feeding for x in (jobs[i].a, jobs[i].b)})
        for t, chunk in source.chunks(cuts, meter.part(feed_weight), chunk_tokens):
            t += a0
            for i in feeding:
                if jobs[i].a <= t < jobs[i].b:
                    replays[i].feed(chunk)
        for i in feeding:
            results[i] = replays[i].result()
    if future:
        parts: dict[int, list[PolicyResult]] = {i: [] for i in future}
        source = routes if (lo, hi) == (0, routes.n_tokens) else routes.tokens(lo, hi)
        for g, weight in zip(groups, group_weights):
            read = meter.part((hi - lo) // 4)
            cols = source.columns(g, read)
            for i in future:
                job = jobs[i]
                part = cols if (job.a, job.b) == (lo, hi) else cols.tokens(job.a - lo, job.b - lo)
                parts[i].append(belady_routes(part, job.slots, n_expert, meter.part(span[i] * len(g) // n_layers),
                                               chunk_tokens))
                del part
            del cols
        for i in future:
            results[i] = (merge_results(parts[i]) if parts[i] else
                          PolicyResult("belady", 0, 0, 0, 0, 0, 0, 0, 0, {}))
    return results  # type: ignore[return-value]


def _engine(name: str, routes: Routes | TraceRoutes, slots: dict[int, int], n_expert: int,
            profile: Sequence[tuple[int, int]], progress: Progress | None, chunk_tokens: int) -> PolicyResult:
    replay = EngineReplay(name, routes.layers, routes.k, slots, n_expert, profile)
    return drive(replay, routes, chunk_tokens, progress)


def lru(routes: Routes | TraceRoutes, slots: dict[int, int], n_expert: int, profile: Sequence[tuple[int, int]] = (),
        progress: Progress | None = None, chunk_tokens: int = ENGINE_CHUNK_TOKENS) -> PolicyResult:
    """The upload mode, replayed by the engine, from its fill of the profile."""
    return _engine("lru", routes, slots, n_expert, profile, progress, chunk_tokens)


def static(routes: Routes | TraceRoutes, slots: dict[int, int], n_expert: int, profile: Sequence[tuple[int, int]],
           progress: Progress | None = None, chunk_tokens: int = ENGINE_CHUNK_TOKENS) -> PolicyResult:
    """The hybrid without adaptation, replayed by the engine: its fill of the profile, then nothing moves."""
    return _engine("static", routes, slots, n_expert, profile, progress, chunk_tokens)


def adaptive(routes: Routes | TraceRoutes, slots: dict[int, int], n_expert: int, profile: Sequence[tuple[int, int]] = (),
             progress: Progress | None = None, chunk_tokens: int = ENGINE_CHUNK_TOKENS) -> PolicyResult:
    """The adaptive hybrid, replayed by the engine with its own constants (docs/cache.md, "Adaptive")."""
    return _engine("adaptive", routes, slots, n_expert, profile, progress, chunk_tokens)


SIMULATOR_ONLY = ("belady", *(f"admit{n}-lrfu" for n in (1, 2, 4, 8)))  # policies the engine does not run

__all__ = [
    "ALL_POLICIES", "BELADY_GROUP_BYTES", "DESCRIPTIONS", "ENGINE_POLICIES", "EngineReplay", "Job", "LRFU_HALF_LIFE",
    "LrfuReplay", "Meter", "POLICIES", "PolicyResult", "REPARTITION_PERIODS", "REPLAYS", "Replay", "SIMULATOR_ONLY",
    "adaptive", "belady", "describe", "drive", "lru", "merge_results", "replay_jobs", "replayer", "run_policy", "static",
]
