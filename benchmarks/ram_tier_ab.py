"""Two builds of the RAM tier against each other on the same machine: the tier's decode at shares of the experts,
each run in a process of its own with the same scarce RAM as benchmarks/ram_tier.py gives it (a balloon, the
model's pages dropped first), the builds alternated, each run repeated.

    python benchmarks/ram_tier_ab.py --lib old=PATH/libllama.so --lib new=PATH/libllama.so [--pcts 50] [--runs 2]

Without --model it uses ram_tier.py's synthesized model (run that once first).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ram_tier as rt  # noqa: E402  (the balloon, the measurement and the model's one home)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--lib", action="append", required=True, help="NAME=PATH of a libllama.so (repeat)")
    ap.add_argument("--pcts", default="50")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--warm", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    from llama_moe import paths
    from llama_moe.tools.experts import expert_layout

    model = a.model or paths.cache_dir() / "models" / "qwen3-30b-a3b-24l-q4_0.gguf"
    layout = expert_layout(model)
    experts = sum(l.bytes_per_expert * l.n_expert for l in layout.layers)
    others = model.stat().st_size - experts
    libs = dict(item.split("=", 1) for item in a.lib)
    args = argparse.Namespace(tokens=a.tokens, warm=a.warm, threads=a.threads, prompt_tokens=0, timeout=900)
    for pct in [float(p) for p in a.pcts.split(",")]:
        tier = experts * pct / 100
        for rep in range(a.runs):
            for name, lib in libs.items():
                os.environ["LLAMA_MOE_LIB"] = lib
                r = rt.measure(model, "tier", tier / rt.MiB, int(tier + others + rt.GiB), args)
                keep = ("tok_s", "misses_per_token", "hit_rate", "disk_wait_ms_per_token", "error")
                print(pct, name, rep, {k: round(v, 3) if isinstance(v, float) else v for k, v in r.items() if k in keep}, flush=True)


if __name__ == "__main__":
    main()
