"""Where greedy decoding on CUDA leaves the no-cache reference: the reference's top-two logit gap at each of
the first steps of a prompt, and each cache mode's own gap and choice at the step where it leaves.
python tests/gpu/h200_margin.py MODEL PROFILE [--steps 24]"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

from llama_moe import Context, ContextParams, Model, ModelParams
from llama_moe.experts import expert_layout

path, profile = Path(sys.argv[1]), Path(sys.argv[2])
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 24
prompt = "The ship left the harbour at dawn, and the crew"
total = expert_layout(path).total_expert_bytes / 2**20


def walk(mib: float, **cache) -> list[tuple[int, float, int]]:
    """Greedy, one token a decode: (token, gap between the top two logits, runner-up) per step."""
    out = []
    with Model(path, ModelParams(cpu_moe=True, use_mmap=False)) as model, \
         Context(model, ContextParams(n_ctx=1024, moe_cache_mib=mib, **cache)) as ctx:
        ctx.decode(model.tokenize(prompt))
        for _ in range(steps):
            logits = ctx.logits()
            order = np.argsort(logits)
            top, second = int(order[-1]), int(order[-2])
            out.append((top, float(logits[top] - logits[second]), second))
            ctx.decode([top])
    return out


ref = walk(0)
print("reference gaps:", " ".join(f"{i}:{g:.4g}" for i, (_, g, _) in enumerate(ref)))
for name, mib, cache in [("upload 100%", total + 1, {}), ("hybrid 50%", total / 2 + 1, {"moe_cache_hybrid": True, "moe_cache_profile": profile})]:
    for mb in ("", "1"):
        if mb:
            os.environ["LLAMA_MOE_CACHE_NO_MAILBOX"] = mb
        got = walk(mib, **cache)
        os.environ.pop("LLAMA_MOE_CACHE_NO_MAILBOX", None)
        first = next((i for i, (a, b) in enumerate(zip(got, ref)) if a[0] != b[0]), None)
        where = "identical" if first is None else (f"leaves at step {first}: reference {ref[first][0]} (gap {ref[first][1]:.4g} "
                                                   f"over {ref[first][2]}), this mode {got[first][0]} (gap {got[first][1]:.4g})")
        print(f"{name}{' no mailbox' if mb else ''}: {where}")
