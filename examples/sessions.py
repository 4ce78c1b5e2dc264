"""Save a conversation with its experts and resume it in a fresh context, warm.

python examples/sessions.py [MODEL.gguf] [--cache-mib 4096] [--admit 2] [-n 32] [--path conversation.session]
(without MODEL: the embedded tiny synthetic model; on a machine without a GPU give --cache-device CPU to run
the cache in RAM)
"""
from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from llama_moe import Context, ContextParams, Model, ModelParams, Sampling
from llama_moe.tools.default_model import default_model_path
from llama_moe.session import load_session, save_session


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model", nargs="?")
    ap.add_argument("--cache-mib", type=float, default=2)
    ap.add_argument("--admit", type=int, default=2, help="missed experts admitted per layer and decode")
    ap.add_argument("--cache-device", help="the device that holds the cache (default: the GPU; CPU: in RAM)")
    ap.add_argument("-n", type=int, default=32, help="tokens before and after the resume")
    ap.add_argument("--path", type=Path, help="where to save the session (default: a temporary file)")
    args = ap.parse_args()
    path = args.path or Path(tempfile.mkdtemp()) / "conversation.session"
    cp = ContextParams(moe_cache_mib=args.cache_mib, moe_cache_hybrid=True, moe_cache_admit=args.admit,
                       moe_cache_device=args.cache_device)
    sampling = Sampling(temperature=0.8, seed=1)
    with Model(args.model or default_model_path(), ModelParams(cpu_moe=True, repack=False)) as model:
        with Context(model, cp) as ctx:
            text = ctx.complete("The ship left the harbour at dawn, and the crew", args.n, sampling).text
            info = save_session(ctx, path)
        print(f"before: ...{text[-60:]!r}")
        print(f"saved {info.n_tokens} tokens, {info.state_bytes} bytes of state and "
              f"{sum(len(v) for v in info.working_set.values())} experts to {path}")
        with Context(model, cp) as ctx:
            info = load_session(ctx, path)
            start = ctx.moe_cache_stats()
            more = ctx.complete([], args.n, sampling).text
            end = ctx.moe_cache_stats()
        rate = (end.n_hit - start.n_hit) / max(1, end.n_lookup - start.n_lookup)
        print(f"resumed with {info.n_warmed} experts brought back: ...{more[-60:]!r}")
        print(f"hit rate after the resume {rate:.3f}")


if __name__ == "__main__":
    main()
