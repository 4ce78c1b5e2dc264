"""``python -m llama_moe bench`` with the admitting hybrid's budget set: bench's ``hybrid-admit`` mode admits
``llama_moe.bench.throughput.ADMIT`` missed experts per layer and decode; this sets it, then runs bench.

    python3 benchmarks/cuda/bench_admit.py --admit 4 -v bench MODEL --modes hybrid-admit ...
    python3 benchmarks/cuda/bench_admit.py --admit auto -v bench MODEL --modes hybrid-admit ...  (the engine's choice)

The rows keep the mode's name ("hybrid-admit"); the file names of --json and --md say which budget they hold.
"""
from __future__ import annotations

import sys

import llama_moe.bench.throughput as throughput
from llama_moe.cli import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    if len(argv) < 2 or argv[0] != "--admit" or not (argv[1].isdigit() or argv[1] == "auto"):
        sys.exit("usage: bench_admit.py --admit N|auto BENCH-ARGS...")
    throughput.ADMIT = argv[1] if argv[1] == "auto" else int(argv[1])
    print(f"bench_admit: hybrid-admit admits {throughput.ADMIT} missed experts per layer and decode", file=sys.stderr)
    sys.exit(main(argv[2:]))
