"""``python -m llama_moe bench-adaptive MODEL``: how much of a good profile the adaptive hybrid cache earns back
when the profile it starts from was made on other text (``llama_moe.tools.bench.adaptive``)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from ..bench.adaptive import CONFIGS, ORDERS, run_bench_adaptive, summary, to_markdown
from ..synth.corpus import TOPICS


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench-adaptive", help="the adaptive cache against profiles from the right and from other text")
    p.add_argument("model")
    p.add_argument("--cache-pct", type=float, default=50, help="slots per layer in %% of its experts (default 50)")
    p.add_argument("-t", "--threads", type=int, default=8)
    p.add_argument("-n", "--n-gen", type=int, default=128, help="generated tokens per run (default 128)")
    p.add_argument("--runs", type=int, default=3, help="generation runs per configuration (default 3)")
    p.add_argument("--warmup", type=int, default=256, help="held-out tokens fed before measuring (default 256)")
    p.add_argument("--measure", type=int, default=0, help="held-out tokens measured after the warm-up (default 0: all)")
    p.add_argument("--window", type=int, default=128, help="tokens per window of the per-window hit rates")
    p.add_argument("--topics", default=",".join(TOPICS[:4]), help="decoded topics, comma-separated (default: the first four)")
    p.add_argument("--other-topics", default=",".join(TOPICS[4:]), help="the wrong profile's topics (default: the last four)")
    p.add_argument("--order", choices=ORDERS, default="interleaved",
                   help="held-out paragraphs one topic after another in turn (interleaved) or topic by topic")
    p.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated, of: " + ", ".join(CONFIGS))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile-dir", help="keep the two profiles here (default: a temporary folder)")
    p.add_argument("--cache-device", metavar="DEVICE", help="the device that holds the cache (moe_cache_device; CPU: in "
                   "RAM, which runs every lookup and speeds nothing up; default: the GPU)")
    p.add_argument("--json", help="write the result as JSON here")
    p.add_argument("--md", help="write the Markdown tables here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    log = lambda s: print(s, file=sys.stderr, flush=True)  # noqa: E731
    split = lambda s: tuple(x.strip() for x in s.split(",") if x.strip())  # noqa: E731
    b = run_bench_adaptive(args.model, args.cache_pct, args.threads, args.n_gen, args.runs, args.warmup,
                           args.measure, args.window, split(args.topics), split(args.other_topics), args.order,
                           args.seed, split(args.configs), args.profile_dir, log, cache_device=args.cache_device)
    text = summary(b) + "\n\n" + to_markdown(b)
    print(text)
    if args.md:
        Path(args.md).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(dataclasses.asdict(b), indent=2) + "\n")
    return 0
