"""``python -m llama_moe bench`` with the admitting hybrid's budget set: bench's ``hybrid-admit`` mode admits
``llama_moe.tools.bench.throughput.ADMIT`` missed experts per layer and decode; this sets it, then runs bench.

    python3 benchmarks/cuda/bench_admit.py --admit 4 -v bench MODEL --modes hybrid-admit ...
    python3 benchmarks/cuda/bench_admit.py --admit auto -v bench MODEL --modes hybrid-admit ...  (the engine's choice)
    python3 benchmarks/cuda/bench_admit.py --admit 2 --repartition 16 -v bench MODEL ...  (slots moved every 16 decodes)

The rows keep the mode's name ("hybrid-admit"); the file names of --json and --md say which budget they hold.
"""
from __future__ import annotations

import sys

import llama_moe.tools.bench.throughput as throughput
from llama_moe.tools.cli import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if len(argv) < 2 or argv[0] != "--admit" or not (argv[1].isdigit() or argv[1] == "auto"):
        sys.exit("usage: bench_admit.py --admit N|auto [--repartition R] BENCH-ARGS...")
    throughput.ADMIT = argv[1] if argv[1] == "auto" else int(argv[1])
    rest = argv[2:]
    if rest[:1] == ["--repartition"]:
        if len(rest) < 2 or not rest[1].isdigit():
            sys.exit("usage: bench_admit.py --admit N|auto [--repartition R] BENCH-ARGS...")
        throughput.REPARTITION, rest = int(rest[1]), rest[2:]
    print(f"bench_admit: hybrid-admit admits {throughput.ADMIT} missed experts per layer and decode, moving slots "
          f"between layers every {throughput.REPARTITION} decodes (0: never)", file=sys.stderr)
    sys.exit(main(rest))
