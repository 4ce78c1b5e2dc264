"""Chat with a MoE model through its own chat template, the answer streamed as it is written.

python examples/chat.py [MODEL.gguf] [--cache-mib 4096] [-n 96] [--template chatml] [--user TEXT ...]
(without MODEL: the embedded tiny synthetic model, which writes corpus-like prose rather than answers; each
--user is one turn, the answers kept in the conversation; on a machine without a GPU give --cache-device CPU
to run the cache in RAM)
"""
from __future__ import annotations

import argparse

from llama_moe import Context, ContextParams, Model, ModelParams, Sampling
from llama_moe.tools.default_model import default_model_path
from llama_moe.chat import ChatStream


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--cache-mib", type=float, default=0)
    ap.add_argument("--cache-device", help="the device that holds the cache (default: the GPU; CPU: in RAM)")
    ap.add_argument("-n", type=int, default=96, help="most tokens an answer")
    ap.add_argument("--template", help="a template the model names, or one of llama.cpp's (default: the model's)")
    ap.add_argument("--system", default="You are a helpful assistant.")
    ap.add_argument("--user", action="append",
                    default=None, help="a user turn (repeat for several; default: two sample turns)")
    args = ap.parse_args()
    turns = args.user or ["The ship left the harbour at dawn, and the crew", "What did they see on the way?"]

    path = args.model or default_model_path()
    with Model(path, ModelParams(cpu_moe=True, repack=False)) as model, \
         Context(model, ContextParams(moe_cache_mib=args.cache_mib, moe_cache_device=args.cache_device)) as ctx:
        messages = [{"role": "system", "content": args.system}]
        for text in turns:
            messages.append({"role": "user", "content": text})
            print(f"user: {text}\nassistant: ", end="", flush=True)
            stream = ChatStream(ctx, messages, max_tokens=args.n, sampling=Sampling(temperature=0.7, seed=1),
                                     template=args.template)
            for piece in stream:
                print(piece, end="", flush=True)
            res = stream.result
            print(f"\n[{len(res.tokens)} tokens at {res.gen_tps:.1f} tok/s, finish: {res.finish_reason}, "
                  f"{res.n_reused} of {len(res.prompt_tokens)} prompt tokens kept from the last turn]\n")
            messages.append(res.message)
        stats = ctx.moe_cache_stats()
        if stats:
            print(f"MoE cache: hit rate {stats.hit_rate:.3f}, {stats.n_miss} experts uploaded")


if __name__ == "__main__":
    main()
