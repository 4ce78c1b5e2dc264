"""This machine's memory bandwidths, measured, for the bounds the benchmark reports beside its results."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


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
