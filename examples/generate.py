"""Stream a generation from a MoE model whose experts stay in RAM, with a VRAM expert cache.

python examples/generate.py MODEL.gguf [--cache-mib 4096] [--profile P.strp] [-n 128]
(without MODEL: the embedded tiny synthetic model; on a machine without a GPU give --cache-device CPU to run
the cache in RAM, which exercises it without making anything faster)
"""
from __future__ import annotations

import argparse

from llama_moe import Context, ContextParams, Model, ModelParams, Sampling
from llama_moe.tools.default_model import default_model_path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--cache-mib", type=float, default=0)
    ap.add_argument("--profile")
    ap.add_argument("--cache-device", help="the device that holds the cache (default: the GPU; CPU: in RAM)")
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("--prompt", default="The ship left the harbour at dawn, and the crew")
    args = ap.parse_args()

    path = args.model or default_model_path()
    # repack=False keeps the experts in their file layout, which the cache copies from
    with Model(path, ModelParams(cpu_moe=True, repack=False)) as model, \
         Context(model, ContextParams(moe_cache_mib=args.cache_mib, moe_cache_profile=args.profile,
                                      moe_cache_device=args.cache_device)) as ctx:
        print(args.prompt, end="", flush=True)
        pending = b""
        for token in ctx.generate(args.prompt, max_tokens=args.n, sampling=Sampling(temperature=0.7, seed=1)):
            pending += model.token_to_piece(token)
            try:
                print(pending.decode(), end="", flush=True)  # a character can span tokens
                pending = b""
            except UnicodeDecodeError:
                continue
        print()
        perf = ctx.perf()
        print(f"\n{perf.n_gen} tokens at {perf.gen_tps:.1f} tok/s")
        stats = ctx.moe_cache_stats()
        if stats:
            print(f"MoE cache: hit rate {stats.hit_rate:.3f}, {stats.n_miss} experts uploaded "
                  f"({stats.n_bytes_upload / 2**20:.1f} MiB), {stats.n_slots} slots")


if __name__ == "__main__":
    main()
