"""The MoE cache's status as the engine decided it (``llama_moe_cache_get_status``): read once the context
exists, and every condition that leaves the cache other than asked said as a ``MoeCacheWarning``."""
from __future__ import annotations

import warnings
from typing import Any

from ..errors import MoeCacheWarning
from ..stats import MoeCacheStatus
from .ffi import ffi


def read_status(lib: Any, ctx: Any) -> MoeCacheStatus:
    out = ffi.new("struct llama_moe_cache_status *")
    if not lib.llama_moe_cache_get_status(ctx, out):
        raise AssertionError("llama_moe_cache_get_status refused a live context")  # only for a null pointer
    return MoeCacheStatus._from_native(out, ffi)


def warn_status(status: MoeCacheStatus, moe_cache_mib: float | str, stacklevel: int, name: str = "moe_cache_mib") -> None:
    """One MoeCacheWarning when the cache asked for is other than asked: off, or partial, with every reason; or
    when it is as asked with a warning of the engine's (an explicit upload mode on a slow link). ``name``: the
    field that asked for it (``moe_ram_mib`` for the RAM tier alone)."""
    if status.as_asked:
        return
    mib = moe_cache_mib if isinstance(moe_cache_mib, str) else f"{moe_cache_mib:g}"
    what = "RAM tier" if name == "moe_ram_mib" else "MoE expert cache"
    if status.state == "off" and moe_cache_mib == 0:  # settings of a cache without its size: the engine names them
        said = f"no MoE expert cache ({name}=0): {status.text}"
    elif status.state == "off":
        said = f"{name}={mib} asked for a {what}, but the context has none: {status.text}"
    elif status.state == "on":
        said = f"{name}={mib}: the {what} is as asked, with a warning: {status.text}"
    else:
        said = f"{name}={mib}: the {what} is not as asked: {status.text}"
    if "no_layer" in status.reasons and "experts in RAM" in status.text:  # llama.cpp's option names, and the binding's
        said += " (in Python: ModelParams(cpu_moe=True) or n_cpu_moe=N, and repack=False on a CPU-only build)"
    warnings.warn(said, MoeCacheWarning, stacklevel=stacklevel + 1)
