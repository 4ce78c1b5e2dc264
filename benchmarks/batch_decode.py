"""Aggregate decode throughput of several sequences in one context, with and without the MoE cache.

python benchmarks/batch_decode.py [MODEL.gguf] [--seqs 1,2,4,8] [-n 64] [--slots 16] [--hybrid] [--threads N]
                                  [--repeat 2]

For each number of sequences, ``llama_moe.batch.generate_batch`` decodes that many corpus paragraphs (one per
sequence, greedy, ``-n`` tokens each, no early end) together: one llama_batch a step, so the MoE layers see
ubatches of as many tokens as sequences. Each run is timed twice (``--repeat``) in a fresh context and the
best kept; tok/s is the tokens decoded in the steps after the prompts over the time of those steps, over all
the sequences together; "on the CPU" is the share of the cache's lookups upload mode's split computed on the
CPU (n_cpu: a ubatch that selects more distinct experts of a layer than its slots takes what the slots serve
and leaves the rest to the CPU; 0 with ``--hybrid``, whose misses all run there). "cache" is the upload cache
(or ``--hybrid``) at ``--slots`` slots per layer; on a
machine without a GPU the cache device is the CPU (--cache-device CPU, the default without a GPU), which
exercises the cache's path without making anything faster. Without MODEL: the embedded tiny synthetic model.
Prints a Markdown table.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llama_moe import Context, ContextParams, Model, ModelParams, MoeCacheStats  # noqa: E402
from llama_moe.tools.default_model import default_model_path  # noqa: E402
from llama_moe.devices import gpus  # noqa: E402
from llama_moe.tools.experts import expert_layout  # noqa: E402
from llama_moe.tools.routing.budget import mib_for_slots  # noqa: E402
from llama_moe.tools.synth.corpus import load_corpus, paragraphs  # noqa: E402
from llama_moe.batch import generate_batch  # noqa: E402


def prompts(n: int) -> list[str]:
    """The first paragraph of n topics (cycling), cut to its first sentence or two: prompts of 10-40 tokens."""
    firsts = [paragraphs(text)[0] for text in load_corpus().values()]
    return [" ".join(firsts[i % len(firsts)].split()[:24 + i // len(firsts)]) for i in range(n)]


def run(model: Model, params: ContextParams, n_seq: int, n_gen: int, repeat: int) -> tuple[float, MoeCacheStats | None]:
    """Best aggregate decode tok/s over ``repeat`` fresh contexts, and the cache's counters in the best run."""
    best, best_stats = 0.0, None
    for _ in range(repeat):
        with Context(model, params) as ctx:
            res = generate_batch(ctx, prompts(n_seq), n_gen, stop_at_eog=False)
            stats = ctx.moe_cache_stats()
        if res.decode_tps > best:
            best, best_stats = res.decode_tps, stats
    return best, best_stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("--seqs", default="1,2,4,8")
    ap.add_argument("-n", type=int, default=64, help="tokens generated per sequence")
    ap.add_argument("--slots", type=int, default=16, help="cache slots per layer")
    ap.add_argument("--hybrid", action="store_true")
    ap.add_argument("--threads", type=int)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--cache-device", help="the device that holds the cache (default: the GPU; without one, CPU)")
    args = ap.parse_args()
    device = args.cache_device or (None if gpus() else "CPU")

    path = Path(args.model) if args.model else default_model_path()
    seqs = [int(s) for s in args.seqs.split(",")]
    layout = expert_layout(path)
    mib = mib_for_slots(layout, args.slots, args.hybrid)
    cache = "hybrid" if args.hybrid else "upload"
    print(f"# batch decode: {path.name}, {layout.n_moe_layers} MoE layers x {layout.n_expert} experts "
          f"(top-{layout.n_expert_used}), {args.n} tokens a sequence, greedy")
    print(f"{datetime.date.today()}, {platform.machine()}, {os.cpu_count()} CPUs, threads {args.threads or 'default'}, "
          f"cache: {cache}, {args.slots} slots a layer ({mib:.1f} MiB) on {device or 'the GPU'}\n")
    print("| sequences | no cache tok/s | cache tok/s | hit rate | on the CPU | speed-up vs 1 sequence (no cache / cache) |")
    print("|---:|---:|---:|---:|---:|---:|")
    base: tuple[float, float] | None = None
    with Model(path, ModelParams(cpu_moe=True, repack=False)) as model:
        for n_seq in seqs:
            n_ctx = n_seq * (args.n + 64)
            common = dict(n_ctx=n_ctx, n_seq_max=n_seq, n_threads=args.threads)
            plain, _ = run(model, ContextParams(**common), n_seq, args.n, args.repeat)
            cached, stats = run(model, ContextParams(**common, moe_cache_mib=mib, moe_cache_hybrid=args.hybrid,
                                                       moe_cache_device=device),
                               n_seq, args.n, args.repeat)
            base = base or (plain, cached)
            hit, on_cpu = ((f"{stats.hit_rate:.3f}", f"{stats.n_cpu / max(stats.n_lookup, 1):.3f}")
                           if stats is not None else ("off", "-"))
            print(f"| {n_seq} | {plain:.1f} | {cached:.1f} | {hit} | {on_cpu} | "
                  f"{plain / base[0]:.2f}x / {cached / base[1]:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
