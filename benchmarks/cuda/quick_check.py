"""A quick CUDA check of the hybrid: no cache, the hybrid through the mailbox and through the scheduler, on the
tiny model, one-token generation and a 16-token ubatch prompt (MMQ). python benchmarks/cuda/quick_check.py MODEL"""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
logging.getLogger("llama_moe.native").setLevel(logging.WARNING)

from llama_moe import Context, ContextParams, Model, ModelParams  # noqa: E402
from llama_moe.tools.experts import expert_layout  # noqa: E402

path = Path(sys.argv[1])
total = expert_layout(path).total_expert_bytes / 2**20
prompt = "The ship left the harbour at dawn, and the crew sang as the sails filled with the morning wind."


def gen(name: str, **cp) -> list[int]:
    with Model(path, ModelParams(cpu_moe=True, use_mmap=False)) as model, \
         Context(model, ContextParams(n_ctx=512, n_batch=16, n_ubatch=16, **cp)) as ctx:
        tokens = list(ctx.generate(prompt, max_tokens=64, stop_at_eog=False))
        s = ctx.moe_cache_stats()
        print(f"{name}: {tokens[:8]}... hits {s.n_hit if s else '-'} misses {s.n_miss if s else '-'}", flush=True)
        return tokens


ref = gen("none")
for label, env in (("hybrid+mailbox", None), ("hybrid-split", "1")):
    if env:
        os.environ["LLAMA_MOE_CACHE_NO_MAILBOX"] = env
    logging.getLogger("llama_moe.native").setLevel(logging.INFO)
    t = gen(label, moe_cache_mib=total / 2, moe_cache_hybrid=True, moe_cache_adaptive=True)
    logging.getLogger("llama_moe.native").setLevel(logging.WARNING)
    os.environ.pop("LLAMA_MOE_CACHE_NO_MAILBOX", None)
    print(f"{label}: tokens {'IDENTICAL' if t == ref else 'DIFFER at ' + str(next(i for i, (a, b) in enumerate(zip(t, ref)) if a != b))} to no cache", flush=True)
