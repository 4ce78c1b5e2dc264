"""A decoder that works in chunks and steers the adaptive cache itself: rebalance between chunks, and watch
the hit rate climb as the cache learns the text's experts.

python examples/chunked_adaptive.py [MODEL.gguf] [--cache-mib N] [--chunks 8] [--chunk 48]
(without MODEL: the embedded tiny model, with the cache in RAM, --cache-device CPU, so that it runs anywhere;
on a GPU machine give a real model, and the cache goes to the GPU)
"""
from __future__ import annotations

import argparse

from llama_moe import Context, ContextParams, Model, ModelParams, Sampling
from llama_moe.tools.default_model import default_model_path
from llama_moe.tools.experts import expert_layout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--cache-mib", type=float, help="default: a quarter of the experts")
    ap.add_argument("--chunks", type=int, default=8)
    ap.add_argument("--chunk", type=int, default=48, help="tokens per chunk")
    ap.add_argument("--cache-device", help="the device that holds the cache (default: the GPU; without MODEL: CPU, in RAM)")
    args = ap.parse_args()
    device = args.cache_device or (None if args.model else "CPU")
    path = args.model or default_model_path()
    mib = args.cache_mib or expert_layout(path).total_expert_bytes / 4 / 2**20
    params = ContextParams(n_ctx=4096, moe_cache_mib=mib, moe_cache_hybrid=True, moe_cache_adaptive=True,
                           moe_cache_device=device)
    with Model(path, ModelParams(cpu_moe=True, repack=False)) as model, Context(model, params) as ctx:
        prompt = model.tokenize("The ship left the harbour at dawn, and the crew")
        ctx.decode(prompt)
        before = ctx.moe_cache_stats()
        for chunk in range(args.chunks):
            # an empty prompt continues where the last chunk stopped
            tokens = list(ctx.generate([], args.chunk, Sampling(temperature=0.8, seed=chunk), stop_at_eog=False))
            now = ctx.moe_cache_stats()
            hits, misses = now.n_hit - before.n_hit, now.n_miss - before.n_miss
            swapped = ctx.rebalance(64)
            print(f"chunk {chunk}: hit rate {hits / max(1, hits + misses):.3f}, {swapped} experts swapped in after it: "
                  f"{model.detokenize(tokens)[:60]!r}")
            before = ctx.moe_cache_stats()


if __name__ == "__main__":
    main()
