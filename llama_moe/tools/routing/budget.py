"""The engine's slot arithmetic, asked of the engine (``llama_moe.policy_replay.size_slots``: the code a context
sizes its cache with): how many expert slots it gives each layer for a cache size, the smallest size that gives
a count, the device memory they take, and the cache size a VRAM budget leaves. Nothing here re-derives a rule of
the engine's: a size's slots are the engine's answer, and a count's size is the smallest size the engine answers
it for."""
from __future__ import annotations

import math
import os
from typing import Callable, Mapping, Sequence

import numpy as np

from ..errors import CacheBudgetError
from ..experts import ExpertLayout
from ...errors import ParameterError
from ...params import MiB, mib_to_bytes
from ...policy_replay import LayerShape, size_slots

GiB = 2**30


def layer_shapes(layout: ExpertLayout) -> list[LayerShape]:
    """The layout's layers as the engine's rules see them: the trace's k, and one group per expert tensor type
    and size (a re-partition moves slots within a group)."""
    groups: dict[tuple[str, int], int] = {}
    return [LayerShape(l.il, l.n_expert, layout.n_expert_used, l.bytes_per_expert, l.bias_bytes_per_expert,
                       groups.setdefault((l.type_name, l.bytes_per_expert), len(groups))) for l in layout.layers]


def _ask(layout: ExpertLayout, cache_bytes: int, hybrid: bool, counts: Mapping[int, int] | None = None) -> dict[int, int]:
    if not layout.layers:
        raise CacheBudgetError("the model has no MoE expert tensors: nothing to cache")
    try:
        return size_slots(layer_shapes(layout), max(int(cache_bytes), 0), hybrid, counts)
    except ParameterError as exc:
        raise CacheBudgetError(f"{exc} (the engine would turn the cache off)") from None


def engine_slots(layout: ExpertLayout, cache_bytes: int, hybrid: bool) -> dict[int, int]:
    """Layer -> slots the engine allocates for a cache of ``cache_bytes``: the same count in every layer, capped at
    the layer's experts (a layer then is held whole), the engine's answer. Assumes every MoE layer's experts are in
    RAM (--cpu-moe), as the tools' traces do. CacheBudgetError when it cannot hold one expert per layer."""
    return _ask(layout, cache_bytes, hybrid)


def _smallest(fits: Callable[[int], bool], low: int) -> int:
    """The smallest size in bytes, at least ``low``, for which ``fits`` (monotone in the size) holds."""
    hi = max(low, 1)
    while not fits(hi):
        low, hi = hi + 1, hi * 2
        if hi > 2**62:
            raise CacheBudgetError("no cache size gives these slots")
    while low < hi:
        mid = (low + hi) // 2
        if fits(mid):
            hi = mid
        else:
            low = mid + 1
    return hi


def _gives(layout: ExpertLayout, hybrid: bool, want: Mapping[int, int], counts: Mapping[int, int] | None) -> Callable[[int], bool]:
    def fits(size: int) -> bool:
        try:
            got = _ask(layout, size, hybrid, counts)
        except CacheBudgetError:
            return False
        return all(got[il] >= n for il, n in want.items())
    return fits


def cache_bytes_for_slots(layout: ExpertLayout, slots: int, hybrid: bool) -> int:
    """The smallest cache size that gives ``slots`` slots per layer (each layer at most its experts), by asking
    the engine."""
    if slots < 1:
        raise CacheBudgetError(f"a cache needs at least one slot per layer, got {slots}")
    if not layout.layers:
        raise CacheBudgetError("the model has no MoE expert tensors: nothing to cache")
    want = {l.il: min(slots, l.n_expert) for l in layout.layers}
    return _smallest(_gives(layout, hybrid, want, None), sum(n * l.bytes_per_expert for l, n in zip(layout.layers, want.values())))


def cache_bytes_for_layer_slots(layout: ExpertLayout, slots: dict[int, int], hybrid: bool) -> int:
    """The smallest cache size that gives each layer ``slots[il]`` slots from a profile's per-layer section
    (every layer of ``layout`` needs a count; counts above a layer's experts count as all of them), by asking
    the engine."""
    want = {l.il: min(slots[l.il], l.n_expert) for l in layout.layers}
    return _smallest(_gives(layout, hybrid, want, slots), sum(n * l.bytes_per_expert for l, n in zip(layout.layers, want.values())))


def engine_layer_slots(layout: ExpertLayout, cache_bytes: int, slots: dict[int, int], hybrid: bool) -> dict[int, int]:
    """Layer -> slots the engine allocates from a profile's per-layer counts for a cache of ``cache_bytes``: the
    counts, scaled down by the engine's rule where they do not fit (the engine's answer)."""
    return _ask(layout, cache_bytes, hybrid, slots)


def slots_beside_whole(layout: ExpertLayout, cache_bytes: int, whole: set[int], hybrid: bool) -> int | None:
    """For a report: the layers ``whole`` hold all their experts, and the others the most equal slots that still
    fit ``cache_bytes`` as a profile's per-layer counts (the engine's answer). The slots per other layer (None:
    there is no other layer), or CacheBudgetError when the whole layers leave less than one slot for each of the
    others."""
    others = [l for l in layout.layers if l.il not in whole]
    if not others:
        return None

    def fits(n: int) -> bool:
        counts = {l.il: (l.n_expert if l.il in whole else n) for l in layout.layers}
        return _gives(layout, hybrid, {l.il: min(c, l.n_expert) for l, c in zip(layout.layers, counts.values())},
                      counts)(cache_bytes)

    if not fits(1):
        raise CacheBudgetError(f"{len(whole)} layers held whole leave less than one slot for each of the other "
                               f"{len(others)} layers")
    lo, hi = 1, max(l.n_expert for l in others)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def engine_buffer_bytes(layout: ExpertLayout, slots: dict[int, int], hybrid: bool) -> int:
    """The device memory the engine allocates for these slots: each layer's slots (and in hybrid mode its
    null slot, unless the layer is held whole) and its expert -> slot map (n_expert int32; a device with a
    coarser alignment than the CPU's pads it, up to the 256 bytes the budget sets aside)."""
    return sum((slots[l.il] + (hybrid and slots[l.il] < l.n_expert)) * l.bytes_per_expert + 4 * l.n_expert
               for l in layout.layers)


def slot_row_bytes(layout: ExpertLayout, hybrid: bool) -> int:
    """Bytes of one slot in every cached layer: what one more slot per layer costs (the engine's answer: the
    smallest size for two slots less that for one)."""
    return cache_bytes_for_slots(layout, 2, hybrid) - cache_bytes_for_slots(layout, 1, hybrid)


def mib_for_slots(layout: ExpertLayout, slots: int, hybrid: bool) -> float:
    """``cache_bytes_for_slots`` in MiB, rounded up to the next 0.01 MiB: a size that prints as it is and still
    gives ``slots`` slots (0.01 MiB is less than a slot of any real model)."""
    return math.ceil(cache_bytes_for_slots(layout, slots, hybrid) / MiB * 100) / 100


def layer_devices(n_layer: int, tensor_split: Sequence[float]) -> list[int]:
    """Layer -> index of the device llama.cpp computes it on, for every layer offloaded (-ngl all, as with
    --cpu-moe) and the layers split by ``tensor_split`` (-ts: each device's share, in the model's device order):
    llama_model::load_tensors' rule in its own float32 arithmetic. The split points are the running sums of the
    shares over their total; the n_layer repeating layers and the output layer are n_layer + 1 places, and
    place il goes to the first device whose split point exceeds il / (n_layer + 1)."""
    shares = [float(x) for x in tensor_split]
    if not shares or not any(shares) or any(not math.isfinite(x) or x < 0 for x in shares):
        raise CacheBudgetError(f"a tensor split is one share >= 0 per device, not all zero, got {list(tensor_split)!r}")
    sums = np.cumsum(np.asarray(shares, dtype=np.float32), dtype=np.float32)
    points = (sums / sums[-1]).astype(np.float32)
    places = np.float32(n_layer + 1)
    return [int(np.searchsorted(points, np.float32(il) / places, side="right")) for il in range(n_layer)]


def cache_device_layers(layout: ExpertLayout, tensor_split: Sequence[float]) -> list[tuple[int, tuple[int, ...]]]:
    """The MoE cache's devices for a split: (device index, its MoE layers), in the order their first layer
    comes, as llama_moe_cache_devices_assign groups them (each layer's slots on the device that computes it)."""
    where = layer_devices(layout.n_layer, tensor_split)
    groups: dict[int, list[int]] = {}
    for l in layout.layers:
        groups.setdefault(where[l.il], []).append(l.il)
    return [(dev, tuple(ils)) for dev, ils in groups.items()]


def _device_layout(layout: ExpertLayout, layers: Sequence[int]) -> ExpertLayout:
    wanted = set(layers)
    mine = ExpertLayout(layout.n_layer, layout.n_expert, layout.n_expert_used,
                        tuple(l for l in layout.layers if l.il in wanted))
    if not mine.layers:
        raise CacheBudgetError(f"no MoE layer among {list(layers)!r}")
    return mine


def engine_device_slots(layout: ExpertLayout, layers: Sequence[int], cache_bytes: int, hybrid: bool) -> int:
    """Slots per layer the engine gives a device holding ``layers`` when the layers are split across devices
    (llama_moe_cache_devices_plan): a device sizes its own layers from ``cache_bytes`` as one device sizes its
    cache (the engine's answer), the most of any of its layers. 0: the device cannot hold one slot per layer (the
    engine leaves its layers on llama.cpp's path). Before the device's free memory, which can only lower it."""
    try:
        return max(engine_slots(_device_layout(layout, layers), cache_bytes, hybrid).values())
    except CacheBudgetError:
        if not any(l.il in set(layers) for l in layout.layers):
            raise
        return 0


def engine_device_layer_slots(layout: ExpertLayout, layers: Sequence[int], cache_bytes: int, slots: dict[int, int],
                              hybrid: bool) -> dict[int, int]:
    """Layer -> slots the engine gives a device holding ``layers`` from a profile's per-layer counts ``slots``
    when the layers are split across devices (llama_moe_cache_devices_plan with the counts): ``engine_layer_slots``
    on that device's layers alone, ``cache_bytes`` being its budget. {}: the device cannot hold one slot per layer
    (the engine leaves its layers on llama.cpp's path). CacheBudgetError for a count of 0 in a layer the cache
    serves: the engine refuses such a profile. Before the device's free memory, which can only lower the counts."""
    mine = _device_layout(layout, layers)
    for l in mine.layers:
        if slots.get(l.il, 0) < 1:
            raise CacheBudgetError(f"the per-layer counts give layer {l.il} no slots, but the cache serves that layer "
                                   f"(the engine refuses such a profile)")
    try:
        return engine_layer_slots(mine, cache_bytes, slots, hybrid)
    except CacheBudgetError:
        return {}


def non_expert_bytes(model_path: str | os.PathLike[str], layout: ExpertLayout) -> int:
    """Bytes of the model's tensors other than the experts: what -ngl 999 --cpu-moe puts on the GPU."""
    from ...gguf_files.reader import read_gguf

    total = sum(t.nbytes for t in read_gguf(model_path).tensors)
    return total - layout.total_expert_bytes


def cache_mib_for_vram(model_path: str | os.PathLike[str], layout: ExpertLayout, vram_gib: float,
                       reserve_gib: float) -> int:
    """Whole MiB left for the cache on a GPU of ``vram_gib``, after the non-expert weights and a reserve
    for the KV cache, compute buffers and the driver."""
    dense = non_expert_bytes(model_path, layout)
    left = vram_gib * GiB - reserve_gib * GiB - dense
    if left < MiB:
        raise CacheBudgetError(f"{vram_gib} GiB of VRAM minus a {reserve_gib} GiB reserve and {dense / GiB:.2f} GiB "
                               f"of non-expert weights leaves nothing for the cache")
    return int(left // MiB)


__all__ = [
    "GiB", "MiB", "cache_bytes_for_layer_slots", "engine_layer_slots", "layer_shapes", "cache_bytes_for_slots", "cache_device_layers", "engine_device_layer_slots", "engine_device_slots", "layer_devices", "cache_mib_for_vram", "engine_buffer_bytes", "engine_slots",
    "mib_for_slots", "mib_to_bytes", "non_expert_bytes", "slot_row_bytes", "slots_beside_whole",
]
