"""One short decode of every MoE cache mode, in one process, for compute-sanitizer (memcheck or racecheck):

    compute-sanitizer --tool memcheck python3 benchmarks/cuda/sanitize_modes.py [--modes upload,hybrid,...] [-n 8]

Each mode decodes a prompt of over 32 tokens (llama.cpp's path, the cache's experts copied from their slots)
and then n one-token steps (the cache's path); the adaptive mode rebalances once in between. Modes: upload,
upload-split (a quarter of the experts, the prompt in ubatches of 16 tokens, each needing more experts than a
layer's slots: the slots serve what they hold and the CPU computes the rest),
hybrid (through the mailbox on CUDA), hybrid-split (through the scheduler), gpu-reads-all (the device reads
every miss from the host copy: MMVQ on host memory), adaptive, admit (the admitting hybrid, one miss a layer
uploaded between decodes, through the mailbox) admit-split (the same through the scheduler) and ram-tier (the experts read from the model's file into slots in
locked RAM, the model loaded with lazy experts, the rest of it on the GPU). --model and
--profile take a tiny model and its profile made beforehand (else both are made here, under the sanitizer). Prints a line per mode and "MODES: DONE"; the
sanitizer's own summary says whether any access was wrong.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from llama_moe import Context, ContextParams, Model, ModelParams
from llama_moe._native.env import environment
from llama_moe.tools.equivalence import PROMPTS
from llama_moe.tools.experts import expert_layout

MODES = ("upload", "upload-split", "hybrid", "hybrid-split", "gpu-reads-all", "adaptive", "admit", "admit-split",
         "admit-repart", "ram-tier")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("-n", type=int, default=8)
    ap.add_argument("--model", type=Path, help="a tiny model made beforehand (with --profile)")
    ap.add_argument("--profile", type=Path, help="its profile")
    a = ap.parse_args()
    from llama_moe.tools.bench.corpus_profile import train_profile
    from llama_moe.tools.synth.synthesize import synthesize
    if a.model and a.profile:
        path, profile = a.model, a.profile
    else:
        tmp = Path(tempfile.mkdtemp())
        path = tmp / "tiny.gguf"
        synthesize(path, shape="tiny", expert_type="q8_0", seed=0)
        profile = train_profile(path, tmp / "p.strp", log=lambda s: None, n_ctx=512)
    mib = expert_layout(path).total_expert_bytes / 2**20 * 0.5 + 1
    hybrid = dict(moe_cache_hybrid=True, moe_cache_profile=str(profile))
    setups = {"upload": ({"moe_cache_profile": str(profile)}, {}), "upload-split": ({}, {}), "hybrid": (hybrid, {}),
              "hybrid-split": (hybrid, {"LLAMA_MOE_CACHE_NO_MAILBOX": "1"}),
              "gpu-reads-all": ({**hybrid, "moe_cache_mailbox_gpu_share": 1}, {}),
              "adaptive": ({"moe_cache_hybrid": True, "moe_cache_adaptive": True}, {}),
              "admit": ({**hybrid, "moe_cache_admit": 1}, {}),
              "admit-split": ({**hybrid, "moe_cache_admit": 1}, {"LLAMA_MOE_CACHE_NO_MAILBOX": "1"}),
              "admit-repart": ({**hybrid, "moe_cache_admit": 2, "moe_cache_repartition": 2}, {})}
    setups["ram-tier"] = ({"moe_ram_mib": mib}, {})
    plain = ModelParams(cpu_moe=True, use_mmap=False)
    lazy = ModelParams(cpu_moe=True, lazy_experts=True, repack=False)
    for name in a.modes.split(","):
        cache, env = setups[name]
        with Model(path, lazy if name == "ram-tier" else plain) as model:
            prompt = model.tokenize(" ".join(PROMPTS))
            with environment(**env):
                split = name == "upload-split"
                device_mib = 0 if name == "ram-tier" else mib / 2 if split else mib
                with Context(model, ContextParams(n_ctx=512, moe_cache_mib=device_mib, **cache)) as ctx:
                    for i in range(0, len(prompt), 16 if split else len(prompt)):
                        ctx.decode(prompt[i:i + 16] if split else prompt)
                    out = list(ctx.generate([], max_tokens=a.n // 2, stop_at_eog=False))
                    if name == "adaptive":
                        ctx.rebalance()
                    out += list(ctx.generate([], max_tokens=a.n - a.n // 2, stop_at_eog=False))
                    s = ctx.moe_cache_stats()
            print(f"{name}: prompt of {len(prompt)} tokens, {len(out)} tokens; {s.n_hit} hits, {s.n_miss} misses, "
                  f"{s.n_copy} prompt copies, {s.n_cpu} split to the CPU, {s.n_swap} swaps, {s.n_admit} admitted, {s.n_moved} slots moved", flush=True)
    print("MODES: DONE")
    return 0


if __name__ == "__main__":
    sys.exit(main())
