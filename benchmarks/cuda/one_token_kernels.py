"""The device's kernels of one-token decoding, for ncu: loads MODEL with the experts in page-locked RAM, makes
a context (--mode vram: every expert in VRAM; hybrid: a PCT% cache with PROFILE, through the mailbox), decodes a
one-token prompt and then N tokens one at a time. Run it under ncu twice with two values of N: the difference
of the per-kernel sums is N2 - N1 tokens' kernels, without the load and the prompt (benchmarks/cuda/ncu_diff.py)."""
from __future__ import annotations

import argparse
from pathlib import Path

from llama_moe import Context, ContextParams, Model, ModelParams
from llama_moe.tools.experts import expert_layout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--mode", choices=("vram", "hybrid"), required=True)
    ap.add_argument("--profile")
    ap.add_argument("--pct", type=float, default=50)
    ap.add_argument("-n", type=int, default=4)
    args = ap.parse_args()
    if args.mode == "vram":
        mp, cp = ModelParams(), ContextParams(n_ctx=256)
    else:
        total = expert_layout(Path(args.model)).total_expert_bytes / 2**20
        mp = ModelParams(cpu_moe=True, use_mmap=False, repack=False)
        cp = ContextParams(n_ctx=256, moe_cache_mib=total * args.pct / 100, moe_cache_hybrid=True,
                           moe_cache_profile=Path(args.profile))
    with Model(args.model, mp) as model, Context(model, cp) as ctx:
        ctx.decode(model.tokenize("The"))
        for i in range(args.n):
            ctx.decode([100 + i])


if __name__ == "__main__":
    main()
