"""The hybrid through the mailbox at one cache size with its CPU side's levers swept in one process (one model load):
the mailbox's CPU threads (``moe_cache_mailbox_threads``; 0 = the engine's default, the context's threads minus
one) and ``GGML_MMID_CHUNK`` (unset = the mailbox's default, a slice per thread), each setting in a context of its
own: decode and pp tok/s (median and spread of RUNS runs, as ``python -m llama_moe bench`` measures them) and the
mailbox's exit lines (the CPU's waits and parts, GB/s) in the log.

    python3 benchmarks/cuda/mailbox_levers.py MODEL --profile P --cache-pct 50 --mailbox-threads 0,8,12 \\
        --chunks unset,8,32 --runs 3 -n 128 > levers.md 2> levers.log

GGML_MMID_CHUNK is read again each time a context is made (ggml_cpu_mmid_chunk_env), so one process can set it
between contexts. The settings run in the order given (threads within chunks); --repeat-first runs the first one
again at the end, so that the machine's drift shows beside the levers.
"""
from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
from pathlib import Path

from llama_moe.tools.bench.throughput import measure_context
from llama_moe.model import Model
from llama_moe.params import ContextParams, ModelParams
from llama_moe.tools.experts import expert_layout


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--profile", type=Path, required=True)
    ap.add_argument("--cache-pct", type=float, default=50.0)
    ap.add_argument("--mailbox-threads", default="0,8,12", help="comma-separated; 0: the engine's default")
    ap.add_argument("--chunks", default="unset,8,32", help="comma-separated GGML_MMID_CHUNK values; unset: not set")
    ap.add_argument("-t", "--threads", type=int, default=16, help="the context's threads")
    ap.add_argument("-n", type=int, default=128, help="tokens generated per run")
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat-first", action="store_true")
    args = ap.parse_args()

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("llama_moe.native").setLevel(logging.INFO)  # the mailbox's exit lines
    threads = [int(x) for x in args.mailbox_threads.split(",")]
    chunks = args.chunks.split(",")
    settings = [(t, c) for c in chunks for t in threads]
    if args.repeat_first:
        settings.append(settings[0])
    mib = expert_layout(args.model).total_expert_bytes / 2**20 * args.cache_pct / 100
    rows = []
    with Model(args.model, ModelParams(cpu_moe=True, use_mmap=False, repack=False)) as model:
        for t, c in settings:
            if c == "unset":
                os.environ.pop("GGML_MMID_CHUNK", None)
            else:
                os.environ["GGML_MMID_CHUNK"] = c
            label = f"mailbox threads {t or 'default'}, GGML_MMID_CHUNK {c}"
            print(f"== {label}", file=sys.stderr, flush=True)
            cp = ContextParams(n_ctx=max(1024, args.pp + args.n + 128), n_batch=args.pp, n_ubatch=args.pp,
                               n_threads=args.threads, moe_cache_mib=mib, moe_cache_hybrid=True,
                               moe_cache_profile=args.profile, moe_cache_mailbox_threads=t or None)
            m = measure_context(model, cp, args.n, args.pp, args.runs, args.seed)
            d, moved = m.decode, m.ram_bytes_per_token
            row = (t or "default", c, statistics.median(d), max(d) - min(d), statistics.median(m.pp), m.hit_rate,
                   None if moved is None else moved / 1e6, m.has_cache, d)
            rows.append(row)
            print(f"{label}: decode {row[2]:.2f} tok/s (spread {row[3]:.2f}; runs {', '.join(f'{x:.2f}' for x in d)}), "
                  f"pp{args.pp} {row[4]:.0f} tok/s, hits {'-' if m.hit_rate is None else f'{m.hit_rate:.3f}'}"
                  f"{'' if m.has_cache else ', NO CACHE'}", file=sys.stderr, flush=True)
            print(f"LEVER {label}: decode {row[2]:.2f} ({row[3]:.2f}) pp {row[4]:.0f}", flush=True)
    print(f"\n{args.model.name}, hybrid through the mailbox, {args.cache_pct:g}% of the experts ({mib:.0f} MiB), "
          f"{args.threads} threads, {args.runs} runs of {args.n} tokens:\n")
    print(f"| mailbox threads | GGML_MMID_CHUNK | decode tok/s | spread | pp{args.pp} tok/s | hit rate | MB/token from RAM |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for t, c, dm, ds, pm, hit, mb, _, _ in rows:
        print(f"| {t} | {c} | {dm:.2f} | {ds:.2f} | {pm:.0f} | {'-' if hit is None else f'{hit:.3f}'} | "
              f"{'-' if mb is None else f'{mb:.1f}'} |")
    return 0 if all(r[7] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
