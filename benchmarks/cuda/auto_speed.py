"""The cache's `auto` size and mode against hand-picked settings, with the GPU's memory made scarce.

    python3 benchmarks/cuda/auto_speed.py MODEL --profile P.strp [--free-gib 10] [-n 128]

A balloon process allocates all of the device's free memory but ``--free-gib`` GiB (the driver API, cuMemAlloc), so
that the model's experts do not all fit. Then, each setting alone: ``moe_cache_mib="auto"`` with
``moe_cache_mode="auto"`` (what the engine chooses: its size and mode from the status), and by hand at the size
auto chose: the static hybrid, the admitting hybrid (1 and 4 uploads per layer and decode), the adaptive hybrid and
upload mode; each decodes ``-n`` greedy tokens after a prompt (timed from the second token). The experts not cached
are computed on the CPU (--cpu-moe).
"""
from __future__ import annotations

import argparse
import ctypes
import multiprocessing as mp
import sys
import time
from pathlib import Path

from llama_moe import Context, ContextParams, Model, ModelParams
from llama_moe.tools.equivalence import PROMPTS

GiB = 1 << 30


def _balloon(free_gib: float, ready, stop) -> None:
    cuda = ctypes.CDLL("libcuda.so.1")
    dev, ctx = ctypes.c_int(), ctypes.c_void_p()
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
    assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
    cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
    want = free.value - int(free_gib * GiB)
    held = []
    while want > 0:  # in pieces of 1 GiB, so that a fragmented device still gives what it has
        piece = min(want, GiB)
        ptr = ctypes.c_uint64()
        if cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(piece)) != 0:
            break
        held.append(ptr)
        want -= piece
    cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
    ready.put(free.value / GiB)
    stop.wait()


def _run(model: str, profile: str, kw: dict, n: int, out) -> None:
    try:
        cp = ContextParams(n_ctx=2048, **({"moe_cache_profile": profile} if profile else {}), **kw)
        with Model(model, ModelParams(cpu_moe=True)) as m, Context(m, cp) as ctx:
            status = ctx.cache_status()
            times = [time.perf_counter() for _ in ctx.generate(ctx.tokenize(PROMPTS[0]), max_tokens=n)]
            s = ctx.moe_cache_stats()
        tps = (len(times) - 1) / (times[-1] - times[0])
        out.put((tps, status.mode, status.n_bytes,
                 f"{s.hit_rate:.3f}" if s else "-", status.choice or status.reason or ""))
    except Exception as e:  # a failed setting is a row that says why
        out.put((0.0, "FAILED", 0, "-", str(e)[:300]))


def one(model: Path, profile: Path, kw: dict, n: int) -> tuple:
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=_run, args=(str(model), str(profile), kw, n, q))
    p.start()
    res = q.get()
    p.join()
    return res


def row(name: str, res: tuple) -> str:
    """One table row of a setting's result (one()'s tuple)."""
    tps, mode, n_bytes, hit, choice = res
    return f"| {name} | {mode} | {n_bytes / 2**20:.0f} | {tps:.2f} | {hit} | {choice} |"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--profile", type=Path, required=True)
    ap.add_argument("--free-gib", type=float, default=10.0)
    ap.add_argument("-n", type=int, default=128)
    a = ap.parse_args(argv)
    ctx = mp.get_context("spawn")
    ready, stop = ctx.Queue(), ctx.Event()
    balloon = ctx.Process(target=_balloon, args=(a.free_gib, ready, stop), daemon=True)
    balloon.start()
    print(f"the device has {ready.get(timeout=120):.1f} GiB free beside the balloon")
    try:
        print("| setting | mode | cache MiB | decode tok/s | hit rate | engine's choice |")
        print("|---|---|---:|---:|---:|---|")
        auto = one(a.model, a.profile, {"moe_cache_mib": "auto", "moe_cache_mode": "auto"}, a.n)
        print(row("auto", auto), flush=True)
        n_bytes = auto[2]
        if not n_bytes:
            return 1
        mib = n_bytes / 2**20
        hand = {"hybrid": {"moe_cache_mode": "hybrid"},
                "admitting, 1": {"moe_cache_mode": "admit", "moe_cache_admit": 1},
                "admitting, 4": {"moe_cache_mode": "admit", "moe_cache_admit": 4},
                "adaptive": {"moe_cache_mode": "adaptive"},
                "upload": {"moe_cache_mode": "upload"}}
        for name, kw in hand.items():
            print(row(name, one(a.model, a.profile, {"moe_cache_mib": mib, **kw}, a.n)), flush=True)
    finally:
        stop.set()
        balloon.join(10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
