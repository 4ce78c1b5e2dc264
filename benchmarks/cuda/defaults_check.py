"""The defaults on a GPU: what the engine chooses with moe_cache_mib="auto" and moe_cache_mode="auto" (the size
after the compute buffers, the link and the CPU's products it measured, the mode), the GPU's free memory once the
context is made, and the tokens against no cache; then upload mode's figures, and auto on a link the test switch
holds to 1 GB/s. python benchmarks/cuda/defaults_check.py MODEL [PROFILE]"""
from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path

from llama_moe import Context, ContextParams, Model, ModelParams
from llama_moe.devices import gpus

path = Path(sys.argv[1])
profile = sys.argv[2] if len(sys.argv) > 2 else None
prompt = "The ship left the harbour at dawn, and the crew sang as the sails filled with the morning wind."
warnings.simplefilter("always")


def run(label: str, n: int = 64, **cp) -> list[int]:
    with Model(path, ModelParams(cpu_moe=True, use_mmap=False)) as model, \
         Context(model, ContextParams(n_ctx=1024, **cp)) as ctx:
        free = gpus()[0].mib_free
        s = ctx.cache_status()
        t0 = time.perf_counter()
        tokens = list(ctx.generate(prompt, max_tokens=n, stop_at_eog=False))
        dt = time.perf_counter() - t0
        st = ctx.moe_cache_stats()
        print(f"{label}: state {s.state} mode {s.mode} admit {s.admit} reasons {s.reasons} slots {s.n_slots} "
              f"bytes {s.n_bytes / 2**20:.1f} MiB; GPU free after {free:.0f} MiB; link {s.link_gbps:.2f} GB/s, "
              f"CPU {s.cpu_gbps:.2f} GB/s; {n / dt:.1f} tok/s (prompt included); admitted {st.n_admit if st else '-'}",
              flush=True)
        for line in filter(None, [s.choice, s.text]):
            print(f"  {line}", flush=True)
        return tokens


ref = run("no cache")
auto = run("auto", moe_cache_mib="auto", moe_cache_mode="auto", moe_cache_profile=profile)
print(f"auto: tokens {'IDENTICAL' if auto == ref else 'DIFFER'} to no cache", flush=True)
run("auto, margin 2000", n=16, moe_cache_mib="auto", moe_cache_margin_mib=2000)
run("upload 1024 MiB", n=16, moe_cache_mib=1024)
os.environ["LLAMA_MOE_TEST_COPY_GBPS"] = "1"
run("auto, link held to 1 GB/s", n=16, moe_cache_mib="auto", moe_cache_mode="auto", moe_cache_profile=profile)
