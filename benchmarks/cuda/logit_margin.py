"""Where greedy decoding on CUDA leaves the no-cache reference: the reference's top-two logit gap at each of
the first steps of a prompt, and each cache mode's own gap and choice at the step where it leaves.
python benchmarks/cuda/logit_margin.py MODEL PROFILE [STEPS (24)]"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from llama_moe import ContextParams, Model, ModelParams
from llama_moe._native.env import environment
from llama_moe.tools.equivalence import PROMPTS, Mode, greedy_steps, top_gap
from llama_moe.tools.experts import expert_layout

path, profile = Path(sys.argv[1]), Path(sys.argv[2])
steps = int(sys.argv[3]) if len(sys.argv) > 3 else 24
prompt = PROMPTS[0]
total = expert_layout(path).total_expert_bytes / 2**20


def walk(model: Model, mode: Mode, mib: float) -> list[tuple[int, float, int]]:
    """Greedy, one token a decode: (token, gap between the top two logits, runner-up) per step."""
    with environment(**mode.env):
        tokens, logits, _ = greedy_steps(model, ContextParams(n_ctx=1024, moe_cache_mib=mib, **mode.cache), prompt, steps)
    return [(t, top_gap(l), int(np.argsort(l)[-2])) for t, l in zip(tokens, logits)]


with Model(path, ModelParams(cpu_moe=True, use_mmap=False)) as model:
    ref = walk(model, Mode(), 0)
    print("reference gaps:", " ".join(f"{i}:{g:.4g}" for i, (_, g, _) in enumerate(ref)))
    hybrid = {"moe_cache_hybrid": True, "moe_cache_profile": profile}
    for name, mib, cache in [("upload 100%", total + 1, {}), ("hybrid 50%", total / 2 + 1, hybrid)]:
        for no_mailbox in (False, True):
            got = walk(model, Mode(cache, {"LLAMA_MOE_CACHE_NO_MAILBOX": "1" if no_mailbox else None}), mib)
            first = next((i for i, (a, b) in enumerate(zip(got, ref)) if a[0] != b[0]), None)
            where = "identical" if first is None else (f"leaves at step {first}: reference {ref[first][0]} (gap {ref[first][1]:.4g} "
                                                       f"over {ref[first][2]}), this mode {got[first][0]} (gap {got[first][1]:.4g})")
            print(f"{name}{' no mailbox' if no_mailbox else ''}: {where}")
