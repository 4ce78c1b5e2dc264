"""Several prompts generated together in one context: one batch a step, each prompt with its own sampler.

python examples/batch.py [MODEL.gguf] [--cache-mib 4096] [-n 48] [--prompt TEXT ...]
(without MODEL: the embedded tiny synthetic model and four sample prompts; on a machine without a GPU give
--cache-device CPU to run the cache in RAM)
"""
from __future__ import annotations

import argparse

from llama_moe import Context, ContextParams, Model, ModelParams, Sampling
from llama_moe.tools.default_model import default_model_path
from llama_moe.batch import generate_batch

PROMPTS = ["The ship left the harbour at dawn, and the crew", "To grow tomatoes in a small garden, start with",
           "The telescope turned towards the faint galaxy", "Before the concert the orchestra"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--cache-mib", type=float, default=0)
    ap.add_argument("--cache-device", help="the device that holds the cache (default: the GPU; CPU: in RAM)")
    ap.add_argument("-n", type=int, default=48, help="most tokens a prompt")
    ap.add_argument("--prompt", action="append", default=None, help="a prompt (repeat for several)")
    args = ap.parse_args()
    prompts = args.prompt or PROMPTS

    path = args.model or default_model_path()
    params = ContextParams(n_ctx=len(prompts) * 512, n_seq_max=len(prompts), moe_cache_mib=args.cache_mib,
                           moe_cache_device=args.cache_device)
    with Model(path, ModelParams(cpu_moe=True, repack=False)) as model, Context(model, params) as ctx:
        # one sampler a prompt: different seeds, the last one greedy; each stops at its own end
        samplings = [Sampling(temperature=0.8, seed=i) for i in range(len(prompts) - 1)] + [Sampling()]
        res = generate_batch(ctx, prompts, max_tokens=args.n, sampling=samplings)
        for i, (prompt, c) in enumerate(zip(prompts, res.completions)):
            print(f"[{i}] {prompt}{c.text}\n    ({len(c.tokens)} tokens, ended by {c.stopped_by})")
        print(f"\n{len(prompts)} sequences: {res.n_decoded} tokens decoded in {res.n_steps} steps at "
              f"{res.decode_tps:.1f} tok/s together")
        stats = ctx.moe_cache_stats()
        if stats:
            print(f"MoE cache: hit rate {stats.hit_rate:.3f}, {stats.n_miss} experts uploaded")


if __name__ == "__main__":
    main()
