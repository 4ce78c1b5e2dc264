"""This machine's memory bandwidths, measured, for the bounds the benchmark reports beside its results."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..._native.ffi import ffi
from ..._native.loader import get_lib


@dataclass(frozen=True)
class CopyBandwidth:
    """A GPU's copy bandwidths in GB/s, measured by the native library."""
    device: str
    h2d_pageable_gbps: float  # host to device from ordinary memory (an mmap'd model's experts)
    h2d_pinned_gbps: float    # from page-locked memory (experts loaded with use_mmap=False); 0 if none
    d2d_gbps: float           # bytes copied per second within the device (each byte read and written)


def gpu_copy_gbps(mib: int = 512) -> list[CopyBandwidth]:
    """Every GPU's copy bandwidths, with buffers of ``mib`` MiB; empty on a build or machine without GPUs."""
    from ...devices import devices

    lib = get_lib()
    out = []
    bw = ffi.new("struct llama_moe_bandwidth *")
    for i, dev in enumerate(devices()):  # in ggml_backend_dev_get's order
        if dev.kind in ("gpu", "igpu") and lib.llama_moe_measure_bandwidth(i, mib * 2**20, bw):
            out.append(CopyBandwidth(dev.name, bw.h2d_pageable_gbps, bw.h2d_pinned_gbps, bw.d2d_gbps))
    return out


def ram_read_gbps(threads: int, mib: int = 1024, repeats: int = 3) -> float:
    """GB/s of reading RAM with ``threads`` threads (numpy sums release the GIL), best of ``repeats``."""
    data = np.ones(mib * 2**20 // 8, dtype=np.float64)  # written once, so that every page is backed
    parts = np.array_split(data, max(threads, 1))
    best = float("inf")
    with ThreadPoolExecutor(max(threads, 1)) as pool:
        for _ in range(repeats):
            t0 = time.perf_counter()
            list(pool.map(np.sum, parts))
            best = min(best, time.perf_counter() - t0)
    return data.nbytes / best / 1e9
