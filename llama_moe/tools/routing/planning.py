"""Planning a cache: the slots the engine will give each layer for a budget, the profile to fill them
from, and what to expect, held out. The mode's own policy scores the plan: static (the hybrid's
counters) with --hybrid, lru (the upload mode) without."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np

from ..experts import ExpertLayout
from ...formats.profile import Profile
from ...policy_replay import max_ubatch
from .budget import (MiB, cache_mib_for_vram, engine_buffer_bytes, engine_slots, layer_shapes, mib_for_slots,
                     mib_to_bytes, non_expert_bytes, slot_row_bytes, slots_beside_whole)
from ..errors import CacheBudgetError, ToolInputError
from .heldout import Estimate, FoldCounts, Folds, KFoldResult, choose_folds, estimate, fold_counts, kfold_result
from .placement import DeviceSplit
from .misscurves import lru_miss_curves, split_slots, static_curves
from .policies import Job, Meter, PolicyResult, replay_jobs
from .ranking import prefill_resident
from .routes import Routes
from .tracefiles import TraceRoutes


@dataclass(frozen=True)
class LayerPlan:
    il: int
    slots: int
    whole: bool
    hit_rate: float | None          # held out, the folds pooled, hits / (hits + misses); None without
                                    # routing, or with nothing looked up
    misses_per_token: float | None  # held out: what the layer leaves to the CPU or to uploads
    cpu_per_token: float | None = None  # held out (upload mode): of the misses, those its split computes on the
                                        # CPU (no slot left in their ubatch)


@dataclass(frozen=True)
class WholeLayer:
    il: int
    misses_per_token: float  # held out under the plan: holding the layer whole removes them
    extra_mib: float         # VRAM to hold it whole beyond its slots


@dataclass(frozen=True)
class WholeLayersReport:
    """Which layers gain most from being held whole, and what holding them whole in the same budget would
    do: the other layers' slots shrink. A report: the profile the plan writes carries no split for it (the
    engine takes a per-layer split from a profile's slot section, which --per-layer writes)."""

    layers: tuple[WholeLayer, ...]
    other_slots: int | None         # slots per other layer with these whole, same budget; None: no fit, or no other layer
    resident_share: Estimate | None  # held out: selected experts resident, the whole layers' included
    uniform_share: Estimate | None   # the same for the plan's uniform slots
    note: str = ("report only: the profile written (--out) does not carry it; the engine takes a per-layer split "
                 "from the profile's slot section, which --per-layer writes")


@dataclass(frozen=True)
class PerLayerSlots:
    """Slots per layer from miss curves, for the same bytes as the plan's equal slots, and what they do held
    out: each fold is replayed with the split made on the other folds' curves, beside the equal slots.

    Compare the two by their misses per token, or by the share of the selected experts resident: both count
    every selection of every layer, so they are over the same lookups for the split and the equal slots. Their
    hit rates are not: a layer held whole needs no lookups and drops out of its hit rate's denominator, and the
    split holds other layers whole than the equal slots do."""

    curve: str                     # the miss curves: lru (upload mode) or static (the hybrid's profile)
    slots: dict[int, int]          # il -> slots, split on the curves of all the routing
    min_slots: int                 # each layer's least
    misses: Estimate | None        # held out, per fold: misses per token (the CPU's included), each fold's own split
    misses_per_token: float        # held out, the folds pooled
    uniform_misses: Estimate | None  # the same folds with the equal slots
    uniform_misses_per_token: float
    resident: Estimate | None      # held out, per fold: share of the selected experts resident, a layer held whole
                                   # counted as resident (the same selections as uniform_resident's)
    uniform_resident: Estimate | None
    hit_rate: Estimate | None      # hits / lookups of the layers looked up: over other lookups than
    uniform_hit_rate: Estimate | None  # uniform_hit_rate's (the plan's estimate) when they hold other layers whole
    tokens: int = 0                # of routing the curves were made from
    note: str = ("the profile written with them (--out) carries these counts: the engine sizes each layer from "
                 "them; without it every cached layer gets the same")

    @property
    def extra_misses(self) -> float | None:
        """The split's misses per token held out over the equal slots', less one (0.25: 25% more); None when the
        equal slots miss nothing."""
        if not self.uniform_misses_per_token:
            return None
        return self.misses_per_token / self.uniform_misses_per_token - 1.0

    def loses(self) -> bool:
        """Whether the split misses more than the equal slots held out: its curves do not carry to new text."""
        return self.misses_per_token > self.uniform_misses_per_token

    def warning(self) -> str:
        """The plan's warning when the split loses held out ("" when it does not)."""
        if not self.loses():
            return ""
        more = self.extra_misses
        pct = f"{more:.0%} more misses" if more is not None else "misses where equal slots miss nothing"
        return (f"the per-layer split loses held out: {pct} per token than equal slots ({self.misses_per_token:.3f} "
                f"against {self.uniform_misses_per_token:.3f} misses/token, each fold split on the others' curves); "
                f"its miss curves ({self.tokens} tokens of routing) do not carry to new text: trace more text, or "
                f"leave --per-layer out (a profile written with it carries the split to the engine)")


@dataclass(frozen=True)
class DevicePlan:
    """One device of a cache whose layers are split across devices: its layers, the slots in each, the memory
    the engine allocates on it, and its layers' figures held out, pooled over them (the CPU's share of the
    misses included, as the engine's per-device counters count them)."""
    name: str
    description: str
    layers: tuple[int, ...]
    slots: int                      # per layer (a layer with fewer experts is held whole)
    buffer_bytes: int               # the engine's buffer on it: its layers' slots, null slots and maps
    hit_rate: Estimate | None       # held out, per fold: hits / (hits + misses) of its layers
    pooled_hit_rate: float | None   # the folds pooled
    misses_per_token: float | None  # held out, its layers together
    cpu_per_token: float | None     # (upload mode) of them, computed on the CPU by the split


@dataclass(frozen=True)
class Plan:
    model: str
    hybrid: bool
    budget: str                  # where the cache size came from
    cache_mib: float
    slots: int                   # per cached layer
    n_layers: int
    n_whole: int
    n_expert: int
    n_expert_used: int
    slot_row_bytes: int          # one slot in every layer
    buffer_bytes: int            # the device memory the engine allocates: slots, null slots, maps
    policy: str                  # the policy that scores the plan: static (hybrid) or lru (upload)
    trace_tokens: int
    folds: int                   # how many (see held_out)
    profile_pairs: int | None    # ranked pairs in the profile
    n_prefilled: int | None      # slots the engine fills from it at load
    hit_rate: Estimate | None    # held out (k-fold)
    h_layer: Estimate | None
    in_sample_hit_rate: float | None  # the profile on its own routing: optimistic, for contrast only
    layers: tuple[LayerPlan, ...]
    whole_layers: WholeLayersReport | None
    warnings: tuple[str, ...] = ()  # what the budget cannot do (upload mode: ubatches it splits with the CPU)
    held_out: str = ""              # how the estimates were held out: "leave one of 4 traces out", ...
    per_layer: PerLayerSlots | None = None  # --per-layer: slots per layer from miss curves
    devices: tuple[DevicePlan, ...] = ()    # layers split across devices: one entry per device, cache_mib each
    bytes_upload_per_token: float | None = None  # held out, the folds pooled: the engine's replay's n_bytes_upload
                                                 # per token (decoding's uploads: the profile's fill at load is not
                                                 # counted); None without routing
    bytes_cpu_per_token: float | None = None     # the same of n_bytes_cpu: the misses computed on the CPU (upload
                                                 # mode: its split's, which a RAM tier reads from the file too)
    ram_mib: float | None = None                 # three tiers: the RAM tier under the cache (--moe-ram-mib)
    ram_slots: int | None = None                 #   its slots per layer, as the engine sizes them
    ram_hit_rate: Estimate | None = None         #   held out: its hits over its lookups (what the cache lacked)
    ram_bytes_disk_per_token: float | None = None  # held out, pooled: its misses' reads of the file per token (not
                                                 #   the start's fill, nor the prompts' ubatches over 32 tokens)


def split_warnings(layout: ExpertLayout, slots: dict[int, int], hybrid: bool,
                   held_out: PolicyResult | None = None, test_tokens: int = 0) -> tuple[str, ...]:
    """Upload mode serves a ubatch's experts from its slots, uploading misses into the slots the ubatch does not
    use, and splits a ubatch that selects more distinct experts of a layer than its slots: the experts left
    without a slot are computed on the CPU (n_cpu). A warning when the slots are fewer than one token selects
    (k: every token computes some experts on the CPU), or than a ubatch the cache looks up can select (k x max_ubatch(),
    at most n_expert: short prompts and several sequences decoded together); with ``held_out`` (the pooled
    held-out replay of ``test_tokens`` tokens) the share of the lookups it computed on the CPU. The hybrid
    computes every miss on the CPU by design: no warning."""
    short = [l for l in layout.layers if slots[l.il] < l.n_expert]
    if hybrid or not short:
        return ()

    def mib(n: int) -> str:
        return f"{mib_for_slots(layout, n, False):g}"

    held = ""
    if held_out is not None and held_out.n_lookup and test_tokens:
        held = (f"; the held-out replay of the routing computed {held_out.n_cpu / held_out.n_lookup:.2%} of its "
                f"lookups on the CPU ({held_out.n_cpu / test_tokens:.3f} experts per token)")
    k, per_layer = layout.n_expert_used, min(slots[l.il] for l in short)
    if per_layer < k:
        return (f"{per_layer} slots per layer are fewer than the {k} experts one token selects: upload mode computes "
                f"at least {k - per_layer} of every token's experts on the CPU in each of the {len(short)} layers not "
                f"held whole{held}; --moe-cache-mib {mib(k)} gives {k} slots",)
    most = max_ubatch()
    need = min(k * most, min(l.n_expert for l in short))
    if per_layer < need:
        return (f"{per_layer} slots per layer serve ubatches of up to {per_layer // k} tokens whole: larger ones of up "
                f"to {most} tokens (short prompts, several sequences decoded together) that select more "
                f"distinct experts than the slots compute the rest on the CPU{held}; {need} slots (--moe-cache-mib "
                f"{mib(need)}) serve them all",)
    return ()


def vram_budget(model: str, layout: ExpertLayout, vram_gib: float, reserve_gib: float) -> tuple[int, str]:
    """The cache size a GPU of ``vram_gib`` leaves (``budget.cache_mib_for_vram``), and how it was reached."""
    mib = cache_mib_for_vram(model, layout, vram_gib, reserve_gib)
    return mib, (f"{vram_gib:g} GiB of VRAM - {reserve_gib:g} GiB reserve - "
                 f"{non_expert_bytes(model, layout) / 2**30:.2f} GiB of non-expert weights")


def slots_budget(layout: ExpertLayout, slots: int | None, hybrid: bool) -> tuple[float, str]:
    """The cache size that gives ``slots`` slots per layer (default: a quarter of the experts; ``mib_for_slots``),
    and how it was reached."""
    slots = slots if slots is not None else max(1, layout.n_expert // 4)
    return mib_for_slots(layout, slots, hybrid), f"{slots} slots per layer"


def split_budget(layout: ExpertLayout, slots: dict[int, int], curves: np.ndarray, layers: Sequence[int],
                 min_slots: int) -> dict[int, int]:
    """The bytes of the equal ``slots`` of ``layers`` split across them by their miss ``curves``
    (``misscurves.split_slots``, weighted by each layer's bytes per expert); other layers keep theirs."""
    by_il = {l.il: l for l in layout.layers}
    looked = [il for il in layers if il in slots]
    rows = [j for j, il in enumerate(layers) if il in slots]
    weights = [by_il[il].bytes_per_expert for il in looked]
    budget = sum(slots[il] * w for il, w in zip(looked, weights))
    out = dict(slots)
    out.update(split_slots(curves[rows], looked, budget, min_slots, weights))
    return out


def default_min_slots(layout: ExpertLayout, hybrid: bool) -> int:
    """A layer's least slots in a per-layer split: one decode's experts (k) in upload mode, below which every
    token computes some of its experts on the CPU; one in the hybrid, whose misses all run on the CPU."""
    return 1 if hybrid else layout.n_expert_used


def per_layer_slots(layout: ExpertLayout, cache_mib: float, hybrid: bool, routes: Routes | TraceRoutes,
                    min_slots: int | None = None, curve: str | None = None) -> dict[int, int]:
    """Slots per layer for a cache of ``cache_mib``: the bytes the engine's equal slots take, split across the
    layers to minimise the total misses on ``routes``' miss curves (``curve``: ``lru``, the default in upload
    mode, or ``static``, the default with ``hybrid``), each layer at least ``min_slots`` (default
    ``default_min_slots``). A profile carries them to the engine (``Profile.layer_slots``, ``with_layer_slots``)."""
    slots = engine_slots(layout, mib_to_bytes(cache_mib), hybrid)
    curve = curve or ("static" if hybrid else "lru")
    lo = default_min_slots(layout, hybrid) if min_slots is None else min_slots
    if curve == "lru":
        curves = lru_miss_curves(routes, layout.n_expert).total()
    elif curve == "static":
        curves = static_curves(fold_counts(routes, [(0, routes.n_tokens)], layout.n_expert).total)
    else:
        raise ToolInputError(f"curve: lru or static, got {curve!r}")
    return split_budget(layout, slots, curves, routes.layers, lo)


def plan_cache(model: str, layout: ExpertLayout, cache_mib: float, hybrid: bool,
               routes: Routes | TraceRoutes | None = None, folds: int | str | Folds | None = None,
               whole_layers: int = 0, budget: str = "",
               progress: Callable[[int, int], None] | None = None, per_layer: bool = False,
               min_slots: int | None = None, devices: Sequence[DeviceSplit] = (),
               ram_mib: float | None = None) -> tuple[Plan, Profile | None]:
    """The plan for a cache of ``cache_mib`` and, with routing, its profile (every selected pair, hottest
    first) scored by k-fold: ``folds`` as ``heldout.choose_folds`` takes them (by default one per trace with
    two or more trace files, else 10 contiguous blocks). ``whole_layers``: report the N layers that gain most
    from being held whole. ``per_layer``: split the same bytes across the layers by their miss curves
    (``per_layer_slots``; each fold held out with a split made on the other folds), each layer at least
    ``min_slots``.
    ``devices``: the layers split across devices (``placement``), ``cache_mib`` on each: each device's layers get
    its slots, and the plan reports every device's layers, slots, bytes and held-out hit rate; ``per_layer`` then
    splits each device's bytes across its own layers (the engine sizes each device's layers from the counts
    within that device's budget). ``ram_mib``: three tiers, a RAM tier of that size under the cache, replayed with
    it (its slots as the engine sizes them, its held-out hit rate and reads of the file).
    Streamed trace files are read once to count the folds (the profile is their sum), once to replay every
    fold and the in-sample figure, and once more for the whole-layers alternative."""
    if devices:
        slots = device_slots(layout, devices)
        if whole_layers:
            raise ToolInputError("--whole-layers reports a budget on one device; the layers here are split across devices")
    else:
        slots = engine_slots(layout, mib_to_bytes(cache_mib), hybrid)
    n_per_layer = min(slots.values())
    n_expert = layout.n_expert
    policy = "static" if hybrid else "lru"
    whole = {il for il, n in slots.items() if n >= n_expert}
    head = (model, hybrid, budget, cache_mib, n_per_layer, len(slots), len(whole), n_expert, layout.n_expert_used,
            slot_row_bytes(layout, hybrid), engine_buffer_bytes(layout, slots, hybrid), policy)
    if routes is None:
        if whole_layers:
            raise ToolInputError("--whole-layers needs routing (--trace T.bin) to know which layers miss most")
        if per_layer:
            raise ToolInputError("--per-layer needs routing (--trace T.bin) for the layers' miss curves")
        layers = tuple(LayerPlan(il, n, il in whole, None, None) for il, n in slots.items())
        warnings = split_warnings(layout, slots, hybrid) if not devices else device_warnings(layout, devices, slots, hybrid)
        return Plan(*head, 0, 0, None, None, None, None, None, layers, None, warnings,
                    devices=_device_plans(layout, devices, slots, hybrid, None, 0)), None

    n = routes.n_tokens
    scheme = choose_folds(routes, folds)
    bounds = list(scheme.bounds)
    w_count, w_replay = n // 8 + 1, 2 * n  # progress: the counts, the folds and the in-sample replay
    meter = Meter(w_count + w_replay * (1 + bool(whole_layers) + bool(per_layer)) + (n if per_layer else 0), progress)
    counts = fold_counts(routes, bounds, n_expert, meter.part(w_count))
    profile = Profile(layout.n_layer, layout.n_expert, n_per_layer, counts.profile())
    prefilled = sum(len(v) for v in prefill_resident(profile.ranked, slots, n_expert).values())
    fold_profiles = counts.fold_profiles()

    ram = engine_slots(layout, mib_to_bytes(ram_mib), False) if ram_mib is not None else None

    def fold_jobs(slot_map: dict[int, int], tier: dict[int, int] | None = None) -> list[Job]:
        return [Job(a, b, policy, slot_map, fp, tier) for (a, b), fp in zip(bounds, fold_profiles)]

    sizes = {shape.il: shape for shape in layer_shapes(layout)}  # the engine's replay counts the bytes it moves
    results = replay_jobs(routes, fold_jobs(slots, ram) + [Job(0, n, policy, slots, profile.ranked, ram)], n_expert,
                          meter.part(w_replay), sizes=sizes)
    scored, in_sample = kfold_result(results[:-1]), results[-1]
    test_tokens = sum(b - a for a, b in bounds)
    pooled = scored.pooled
    layers = tuple(LayerPlan(il, n_slots, il in whole, 1.0 if il in whole else pooled.layer_hit_rate(il),
                             pooled.per_layer.get(il, (0, 0))[1] / test_tokens,
                             pooled.per_layer_cpu.get(il, 0) / test_tokens)
                   for il, n_slots in slots.items())
    warnings = split_warnings(layout, slots, hybrid, pooled, test_tokens) if not devices else device_warnings(layout, devices, slots, hybrid)

    def replay(slot_map: dict[int, int]) -> KFoldResult:
        return kfold_result(replay_jobs(routes, fold_jobs(slot_map), n_expert, meter.part(w_replay)))

    report = None
    if whole_layers:
        lookups = _fold_lookups(routes, counts)
        report = _whole_layers(layout, routes.layers, lookups, test_tokens, slots, hybrid, cache_mib, scored,
                               whole_layers, replay)
    split = None
    if per_layer:
        lo = default_min_slots(layout, hybrid) if min_slots is None else min_slots
        split = _per_layer(layout, routes, counts, slots, policy, lo, fold_profiles, scored, test_tokens,
                           meter.part(n), lambda jobs: replay_jobs(routes, jobs, n_expert, meter.part(w_replay)),
                           [d.layers for d in devices])
    if progress:
        progress(meter.total, meter.total)  # the alternative may not have been replayed: it did not fit
    if split is not None:
        profile = with_layer_slots(profile, split.slots)
        if split.loses():
            warnings += (split.warning(),)
    plan = Plan(*head, n, scheme.k, len(profile.ranked), prefilled, scored.hit_rate, scored.h_layer,
                in_sample.hit_rate, layers, report, warnings, scheme.describe(), split,
                _device_plans(layout, devices, slots, hybrid, scored, test_tokens),
                _per_token_of(pooled.n_bytes_upload, test_tokens), _per_token_of(pooled.n_bytes_cpu, test_tokens))
    if ram is not None:
        plan = replace(plan, ram_mib=ram_mib, ram_slots=min(ram.values()),
                       ram_hit_rate=estimate([r.ram_hit_rate for r in scored.folds]),
                       ram_bytes_disk_per_token=_per_token_of(pooled.n_bytes_disk, test_tokens))
    return plan, profile


def _per_token_of(count: int | None, tokens: int) -> float | None:
    return None if count is None or not tokens else count / tokens


def _on(layout: ExpertLayout, layers: Sequence[int]) -> ExpertLayout:
    """The layout of ``layers`` alone: what one device of a split budgets for."""
    return ExpertLayout(layout.n_layer, layout.n_expert, layout.n_expert_used,
                        tuple(l for l in layout.layers if l.il in set(layers)))


def device_warnings(layout: ExpertLayout, devices: Sequence[DeviceSplit], slots: dict[int, int],
                    hybrid: bool) -> tuple[str, ...]:
    """``split_warnings`` for each device, its sizes per device (its own layers' bytes), named."""
    return tuple(f"{d.name}: {w}" for d in devices for w in split_warnings(_on(layout, d.layers), slots, hybrid))


def device_slots(layout: ExpertLayout, devices: Sequence[DeviceSplit]) -> dict[int, int]:
    """Layer -> slots from the devices' slots per layer (each capped at the layer's experts), in model order;
    ToolInputError unless every MoE layer is on exactly one device."""
    where: dict[int, DeviceSplit] = {}
    for d in devices:
        for il in d.layers:
            if il in where:
                raise ToolInputError(f"layer {il} is on both {where[il].name} and {d.name}")
            where[il] = d
    missing = [l.il for l in layout.layers if l.il not in where]
    if missing or len(where) != len(layout.layers):
        raise ToolInputError(f"the devices' layers {sorted(where)} are not the model's MoE layers "
                             f"{[l.il for l in layout.layers]}")
    return {l.il: min(where[l.il].slots_of()[l.il], l.n_expert) for l in layout.layers}


def _device_plans(layout: ExpertLayout, devices: Sequence[DeviceSplit], slots: dict[int, int], hybrid: bool,
                  scored: KFoldResult | None, test_tokens: int) -> tuple[DevicePlan, ...]:
    """Each device's part of the plan: its layers' slots and buffer, and their held-out counts summed (per fold
    for the estimate, pooled for the rest)."""
    out = []
    for d in devices:
        mine = _on(layout, d.layers)
        nbytes = d.n_bytes if d.n_bytes is not None else engine_buffer_bytes(mine, slots, hybrid)
        rate = pooled_rate = misses = cpu = None
        if scored is not None and scored.pooled is not None and test_tokens:
            def counts(r: PolicyResult) -> tuple[int, int]:
                return (sum(r.per_layer.get(il, (0, 0))[0] for il in d.layers),
                        sum(r.per_layer.get(il, (0, 0))[1] for il in d.layers))
            per_fold = [counts(r) for i, r in enumerate(scored.folds) if i not in scored.too_short]
            rates = [h / (h + m) for h, m in per_fold if h + m]
            rate = estimate(rates)
            h, m = counts(scored.pooled)
            pooled_rate = h / (h + m) if h + m else None
            misses = m / test_tokens
            cpu = sum(scored.pooled.per_layer_cpu.get(il, 0) for il in d.layers) / test_tokens
        out.append(DevicePlan(d.name, d.description, tuple(d.layers), d.slots, nbytes, rate, pooled_rate, misses, cpu))
    return tuple(out)


def with_layer_slots(profile: Profile, slots: dict[int, int]) -> Profile:
    """The profile with a per-layer slot section: ``slots`` (il -> slots) for the layers it names, 0 (no count)
    for the others. The engine sizes each cached layer from it instead of giving every layer the same."""
    counts = tuple(int(slots.get(il, 0)) for il in range(profile.n_layers))
    return Profile(profile.n_layers, profile.n_expert, profile.n_slots, profile.ranked, counts)


def split_devices_budget(layout: ExpertLayout, slots: dict[int, int], curves: np.ndarray, layers: Sequence[int],
                         min_slots: int, groups: Sequence[Sequence[int]] = ()) -> dict[int, int]:
    """``split_budget`` within each group of layers (``groups``: each device's layers, when the layers are split
    across devices): a device's bytes stay on its own layers, as the engine sizes each device's layers within its
    own budget. No groups: one split over all the layers."""
    if not groups:
        return split_budget(layout, slots, curves, layers, min_slots)
    out = dict(slots)
    for group in groups:
        out.update(split_budget(layout, {il: slots[il] for il in group if il in slots}, curves, layers, min_slots))
    return out


def _per_layer(layout: ExpertLayout, routes: Routes | TraceRoutes, counts: FoldCounts, slots: dict[int, int],
               policy: str, min_slots: int, fold_profiles: Sequence, scored: KFoldResult, test_tokens: int,
               progress: Callable[[int, int], None] | None, replay: Callable[[list[Job]], list],
               groups: Sequence[Sequence[int]] = ()) -> PerLayerSlots:
    """The split on all the routing's curves, and each fold replayed with the split of the other folds'
    (``groups``: each device's layers, split within their device's bytes)."""
    if policy == "lru":
        per_fold = lru_miss_curves(routes, layout.n_expert, counts.bounds, progress)
        whole, train = per_fold.total(), [per_fold.total(f) for f in range(len(counts.bounds))]
    else:
        whole, train = static_curves(counts.total), [static_curves(c) for c in counts.train]
    split = split_devices_budget(layout, slots, whole, routes.layers, min_slots, groups)
    maps = [split_devices_budget(layout, slots, c, routes.layers, min_slots, groups) for c in train]
    jobs = [Job(a, b, policy, m, fp) for (a, b), m, fp in zip(counts.bounds, maps, fold_profiles)]
    result = kfold_result(replay(jobs))
    lookups = _fold_lookups(routes, counts)
    lengths = [b - a for a, b in counts.bounds]

    def lost(r: KFoldResult) -> float:
        p = r.pooled
        return p.n_miss / test_tokens if p is not None else 0.0

    return PerLayerSlots(policy, split, min_slots,
                         _per_token(result, lengths), lost(result), _per_token(scored, lengths), lost(scored),
                         _share(lookups, routes.layers, result, maps, layout.n_expert),
                         _share(lookups, routes.layers, scored, [slots] * len(maps), layout.n_expert),
                         result.hit_rate, scored.hit_rate, routes.n_tokens)


def _per_token(result: KFoldResult, lengths: Sequence[int]) -> Estimate | None:
    """Per fold, misses per token of the fold (a layer held whole misses nothing); None under two folds."""
    values = [r.n_miss / n for i, (r, n) in enumerate(zip(result.folds, lengths)) if n and i not in result.too_short]
    return estimate(values)


def _fold_lookups(routes: Routes | TraceRoutes, counts: FoldCounts) -> np.ndarray:
    """[folds, n_layers]: distinct experts the cache would look up in each layer of each fold (what a whole
    layer serves without lookups). One token per ubatch: every selection of a computed token, the fold's
    counts; larger ubatches are looked up only up to 32 tokens, counted from the routing in memory."""
    if routes.one_token_ubatches:
        return counts.test.sum(axis=2)
    out = np.zeros((len(counts.bounds), len(routes.layers)), dtype=np.int64)
    for f, (a, b) in enumerate(counts.bounds):
        test = routes.tokens(a, b)
        for j in range(len(routes.layers)):
            d = test.distinct[:, j]
            out[f, j] = int(((d >= 0) & test.counted[:, j][:, None]).sum())
    return out


def _share(lookups: np.ndarray, layers: Sequence[int], result: KFoldResult,
           slot_maps: dict[int, int] | Sequence[dict[int, int]], n_expert: int) -> Estimate | None:
    """Per fold, the share of selected experts that were resident, the whole layers' counted as resident
    (the policies do not count layers held whole: they need no lookups): the same selections whatever the
    slots. ``slot_maps``: the slots of every fold, or each fold's own. None under two folds."""
    maps = [slot_maps] * len(result.folds) if isinstance(slot_maps, dict) else list(slot_maps)
    shares = []
    for f, (r, slot_map) in enumerate(zip(result.folds, maps)):
        if f in result.too_short:
            continue
        served = sum(int(lookups[f, j]) for j, il in enumerate(layers) if slot_map.get(il, 0) >= n_expert)
        total = r.n_lookup + served
        shares.append((r.n_hit + served) / total if total else 1.0)
    return estimate(shares)


def _whole_layers(layout: ExpertLayout, route_layers: Sequence[int], lookups: np.ndarray, test_tokens: int,
                  slots: dict[int, int], hybrid: bool, cache_mib: float, scored: KFoldResult, n: int,
                  replay: Callable[[dict[int, int]], KFoldResult]) -> WholeLayersReport:
    uniform = _share(lookups, route_layers, scored, slots, layout.n_expert)
    options = []
    for l in layout.layers:
        if slots[l.il] < l.n_expert:
            extra = (l.n_expert - slots[l.il]) * l.bytes_per_expert / MiB
            left = scored.pooled.per_layer.get(l.il, (0, 0))[1]  # the CPU's included: a whole layer serves them too
            options.append(WholeLayer(l.il, left / test_tokens, extra))
    options.sort(key=lambda w: (-w.misses_per_token / w.extra_mib, w.il))  # most misses removed per MiB
    chosen = tuple(options[:n])
    whole = {w.il for w in chosen}
    if not chosen:
        return WholeLayersReport((), None, None, uniform)
    try:
        other_slots = slots_beside_whole(layout, mib_to_bytes(cache_mib), whole, hybrid)
    except CacheBudgetError:  # they do not fit with a slot for each other layer
        return WholeLayersReport(chosen, None, None, uniform)
    alt = {l.il: l.n_expert if l.il in whole else int(other_slots or 0) for l in layout.layers}
    return WholeLayersReport(chosen, other_slots, _share(lookups, route_layers, replay(alt), alt,
                                                                  layout.n_expert), uniform)
