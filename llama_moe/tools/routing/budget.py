"""The engine's arithmetic, mirrored: how many expert slots it gives each layer for a cache size (exactly as
llama_moe_cache::create computes them, tested equal to the engine), the device memory they take, the ubatches
it looks up, and the cache size a VRAM budget leaves. The one place in Python that knows these numbers."""
from __future__ import annotations

import math
import os
from typing import Sequence

import numpy as np

from ..errors import CacheBudgetError
from ..experts import ExpertLayout
from ...params import MiB, mib_to_bytes

GiB = 2**30
MAX_UBATCH = 32  # LLAMA_MOE_CACHE_MAX_UBATCH: larger ubatches keep llama.cpp's path and are not looked up


def _map_bytes(n_expert: int) -> int:
    # each layer's int32 expert -> slot map, padded to 256 bytes (GGML_PAD(n_expert * 4, 256))
    return -(-n_expert * 4 // 256) * 256


def _fixed_bytes(layout: ExpertLayout, hybrid: bool) -> tuple[int, int]:
    """(bytes of one slot in every layer, bytes the engine sets aside before slots: maps and null slots)."""
    row = sum(l.bytes_per_expert + (l.bias_bytes_per_expert if hybrid else 0) for l in layout.layers)
    maps = sum(_map_bytes(l.n_expert) for l in layout.layers)
    # hybrid: one zero-filled null slot per layer, budgeted even for layers that end up held whole
    return row, maps + (row if hybrid else 0)


def slot_row_bytes(layout: ExpertLayout, hybrid: bool) -> int:
    """Bytes of one slot in every cached layer (and, in hybrid mode, a copy of its biases beside each slot)."""
    return _fixed_bytes(layout, hybrid)[0]


def engine_slots(layout: ExpertLayout, cache_bytes: int, hybrid: bool) -> dict[int, int]:
    """Layer -> slots the engine allocates for a cache of ``cache_bytes``: the same count in every layer
    (budget / bytes of one slot in every layer), capped at the layer's experts (a layer then is held whole).
    Assumes every MoE layer's experts are in RAM (--cpu-moe), as the tools' traces do."""
    if not layout.layers:
        raise CacheBudgetError("the model has no MoE expert tensors: nothing to cache")
    row, fixed = _fixed_bytes(layout, hybrid)
    slots = max(cache_bytes - fixed, 0) // row
    if slots < 1:
        raise CacheBudgetError(
            f"{cache_bytes / MiB:.2f} MiB cannot hold one expert per layer: {len(layout.layers)} layers need at least "
            f"{mib_for_slots(layout, 1, hybrid):.2f} MiB{' in hybrid mode' if hybrid else ''} (the engine would turn the "
            f"cache off)")
    return {l.il: min(slots, l.n_expert) for l in layout.layers}


def slots_beside_whole(layout: ExpertLayout, cache_bytes: int, whole: set[int], hybrid: bool) -> int | None:
    """The engine's arithmetic with a per-layer split, for a report: the layers ``whole`` hold all their experts
    first, and the others share what is left evenly. The slots per other layer (None: there is no other layer),
    or CacheBudgetError when the whole layers leave less than one slot for each of the others."""
    others = [l for l in layout.layers if l.il not in whole]
    row_others = sum(l.bytes_per_expert for l in others)
    left = (cache_bytes - sum(l.n_expert * l.bytes_per_expert for l in layout.layers if l.il in whole)
            - _fixed_bytes(layout, False)[1] - (row_others if hybrid else 0))
    other_slots = min(max(left, 0) // row_others, layout.n_expert) if others else None
    if left < 0 or (other_slots is not None and other_slots < 1):
        raise CacheBudgetError(f"{len(whole)} layers held whole leave less than one slot for each of the other "
                               f"{len(others)} layers")
    return other_slots


def engine_buffer_bytes(layout: ExpertLayout, slots: dict[int, int], hybrid: bool) -> int:
    """The device memory the engine allocates for these slots: each layer's slots (and in hybrid mode its
    null slot, unless the layer is held whole) and its expert -> slot map (n_expert int32; a device with a
    coarser alignment than the CPU's pads it, up to the 256 bytes the budget sets aside)."""
    return sum((slots[l.il] + (hybrid and slots[l.il] < l.n_expert)) * l.bytes_per_expert + 4 * l.n_expert
               for l in layout.layers)


def cache_bytes_for_layer_slots(layout: ExpertLayout, slots: dict[int, int], hybrid: bool) -> int:
    """The smallest cache size that gives each layer ``slots[il]`` slots from a profile's per-layer section
    (every layer of ``layout`` needs a count; counts above a layer's experts count as all of them)."""
    row, fixed = _fixed_bytes(layout, hybrid)
    return fixed + sum(min(slots[l.il], l.n_expert) * (l.bytes_per_expert + (l.bias_bytes_per_expert if hybrid else 0))
                       for l in layout.layers)


def engine_layer_slots(layout: ExpertLayout, cache_bytes: int, slots: dict[int, int], hybrid: bool) -> dict[int, int]:
    """Layer -> slots the engine allocates from a profile's per-layer counts for a cache of ``cache_bytes``: each
    count capped at the layer's experts; counts that do not fit are each scaled by (bytes left for slots) /
    (bytes they take) and rounded down, at least one, then, while they still do not fit, the layer with the
    most slots (the first of equals) gives one up."""
    row, fixed = _fixed_bytes(layout, hybrid)
    if cache_bytes - fixed < row:
        raise CacheBudgetError(f"{cache_bytes / MiB:.2f} MiB cannot hold one expert per layer")
    per = [l.bytes_per_expert + (l.bias_bytes_per_expert if hybrid else 0) for l in layout.layers]
    out = [min(slots[l.il], l.n_expert) for l in layout.layers]
    avail = cache_bytes - fixed
    need = sum(n * b for n, b in zip(out, per))
    if need > avail:
        out = [max(1, math.floor(n * (avail / need))) for n in out]
        while sum(n * b for n, b in zip(out, per)) > avail and max(out) > 1:
            out[out.index(max(out))] -= 1
    return {l.il: n for l, n in zip(layout.layers, out)}


def cache_bytes_for_slots(layout: ExpertLayout, slots: int, hybrid: bool) -> int:
    """The smallest cache size that gives ``slots`` slots per layer."""
    if slots < 1:
        raise CacheBudgetError(f"a cache needs at least one slot per layer, got {slots}")
    row, fixed = _fixed_bytes(layout, hybrid)
    return slots * row + fixed


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


def engine_device_slots(layout: ExpertLayout, layers: Sequence[int], cache_bytes: int, hybrid: bool) -> int:
    """Slots per layer the engine gives a device holding ``layers`` when the layers are split across devices
    (llama_moe_cache_devices_plan): ``cache_bytes`` is that device's budget, less its layers' maps (and the
    hybrid's null slots), over the bytes of one slot in each of its layers, at most the most experts of its
    layers. 0: the device cannot hold one slot per layer (the engine leaves its layers on llama.cpp's path).
    Before the device's free memory, which can only lower it."""
    mine = [l for l in layout.layers if l.il in set(layers)]
    if not mine:
        raise CacheBudgetError(f"no MoE layer among {list(layers)!r}")
    row = sum(l.bytes_per_expert + (l.bias_bytes_per_expert if hybrid else 0) for l in mine)
    fixed = sum(_map_bytes(l.n_expert) for l in mine) + (row if hybrid else 0)
    slots = max(cache_bytes - fixed, 0) // row
    return int(min(slots, max(l.n_expert for l in mine))) if slots >= 1 else 0


def engine_device_layer_slots(layout: ExpertLayout, layers: Sequence[int], cache_bytes: int, slots: dict[int, int],
                              hybrid: bool) -> dict[int, int]:
    """Layer -> slots the engine gives a device holding ``layers`` from a profile's per-layer counts ``slots``
    when the layers are split across devices (llama_moe_cache_devices_plan with the counts): ``engine_layer_slots``
    on that device's layers alone, ``cache_bytes`` being its budget (less its layers' maps and the hybrid's null
    slots). {}: the device cannot hold one slot per layer (the engine leaves its layers on llama.cpp's path).
    CacheBudgetError for a count of 0 in a layer the cache serves: the engine refuses such a profile. Before the
    device's free memory, which can only lower the counts."""
    wanted = set(layers)
    mine = ExpertLayout(layout.n_layer, layout.n_expert, layout.n_expert_used,
                        tuple(l for l in layout.layers if l.il in wanted))
    if not mine.layers:
        raise CacheBudgetError(f"no MoE layer among {list(layers)!r}")
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
    "GiB", "MAX_UBATCH", "MiB", "cache_bytes_for_slots", "cache_device_layers", "engine_device_layer_slots", "engine_device_slots", "layer_devices", "cache_mib_for_vram", "engine_buffer_bytes", "engine_slots",
    "mib_for_slots", "mib_to_bytes", "non_expert_bytes", "slot_row_bytes", "slots_beside_whole",
]
