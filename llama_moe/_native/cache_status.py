"""The MoE cache's state as the binding learns it today, before the context exists and right after: which device
will hold it, whether the size asked for fits there, and why llama.cpp went on without it.

A stand-in for one C call, ``llama_moe_cache_get_status(ctx, &status)`` (state, reason, device, slots per
layer), which the library does not have yet: until it does, the device is chosen here as llama-moe-cache.cpp
chooses it, the fit uses the engine's arithmetic (``routing.budget``), and the reason is read from llama.cpp's
log. Everything that does so is in this module, so that the C call replaces it in one place."""
from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from . import log as _log
from .ffi import ffi
from ..errors import ParameterError


def cache_device() -> Any:
    """The device the native cache will use when it is a GPU (llama-moe-cache.cpp: LLAMA_MOE_CACHE_DEVICE, else the
    model's first GPU); None for RAM or no device (llama.cpp then says why the cache is off)."""
    from ..devices import devices

    name = os.environ.get("LLAMA_MOE_CACHE_DEVICE", "")
    found = devices()
    if name:
        found = [d for d in found if d.name.lower() == name.lower()]
    found = [d for d in found if d.kind in ("gpu", "igpu")]
    return found[0] if found else None


def check_cache_fits(model: Any, params: Any) -> None:
    """A cache larger than the free memory of its GPU is refused before llama.cpp tries to allocate it. The
    engine never allocates more than every expert of the layers kept in RAM, so a large request is fine when
    those fit."""
    from ..experts import expert_layout
    from ..params import mib_to_bytes
    from ..routing.budget import cache_bytes_for_slots  # the engine's arithmetic, until the C call says it

    mp = model.params
    if not (mp.cpu_moe or mp.n_cpu_moe or mp.cpu_tensor_patterns):
        return  # no experts in RAM: llama.cpp turns the cache off and says so
    dev = cache_device()
    if dev is None or dev.free_bytes <= 0:
        return
    layout = expert_layout(model.path)
    in_ram = tuple(l for l in layout.layers if mp.cpu_moe or mp.cpu_tensor_patterns or l.il < mp.n_cpu_moe)
    if not in_ram:
        return
    full = cache_bytes_for_slots(replace(layout, layers=in_ram), max(l.n_expert for l in in_ram), params.moe_cache_hybrid)
    need = min(mib_to_bytes(params.moe_cache_mib), full)
    if need > dev.free_bytes:
        raise ParameterError(
            f"moe_cache_mib={params.moe_cache_mib:g} asks for {need / 2**20:.0f} MiB on {dev.name} ({dev.description}), "
            f"which has {dev.mib_free:.0f} MiB free with the model loaded; ask for less, leaving room for the KV cache "
            f"and the compute buffers")


def cache_off_reason(lib: Any, ctx: Any) -> str | None:
    """Why a context made with a cache asked for has none (llama.cpp's own warning), or None when it has one."""
    if lib.llama_moe_cache_get_stats(ctx, ffi.new("struct llama_moe_cache_stats *")):
        return None
    said = [line for line in _log.recent_problems() if "moe" in line.lower()]
    reason = "; ".join(said) or "llama.cpp gave no reason"
    if "experts in RAM" in reason:  # llama.cpp's option names, and the binding's
        reason += " (in Python: ModelParams(cpu_moe=True) or n_cpu_moe=N, and repack=False on a CPU-only build)"
    return reason
