"""Routing-trace throughput: how fast the tools read, rank and replay a large trace, and in how much memory.

python benchmarks/trace_throughput.py [--gib 1] [--dir DIR] [--keep] [--slots 32] [--policies lru,static]

Writes a synthetic trace of Qwen3-30B-A3B's shape (48 MoE layers x 128 experts, top-8: 72 bytes a record)
of about --gib GiB into a temporary folder (or --dir), then, in this one process as the tools run them:
reads it (``read_routes``, validated against the model's layout), ranks the profile (``make_profile``),
replays every token through each policy of --policies with that profile at --slots slots per layer, and
runs the ``simulate --test`` path (``simulate_sizes``: ranked on the first half of the tokens, replayed on
the second). Prints a Markdown table: seconds, trace records per second, and the process's peak RSS so far
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``), beside the file's size; the trace is written by a child
process, so that the generator's memory is not counted. The routing is skewed and sticky
like a real router's (a hot expert per token and layer, kept from the previous token half the time, and
seven fixed offsets from it); the policies' speed depends on the hit rate, so read the figures for this
routing. The file is read right after it is written: from the page cache, not from the disk.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from llama_moe.experts import ExpertLayout, LayerExperts  # noqa: E402
from llama_moe.tools import make_profile, read_routes, run_policy, simulate_sizes  # noqa: E402
from llama_moe.tools.budget import MiB, cache_bytes_for_slots  # noqa: E402
from llama_moe.trace import record_bytes  # noqa: E402

N_LAYER, N_EXPERT, K = 48, 128, 8
BYTES_PER_EXPERT = 3 * 2048 * 768 * 34 // 32  # gate, up, down of one expert in q8_0 (only sizes the --cache-mib)


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def write_synthetic(path: Path, n_tokens: int, seed: int, chunk: int = 1024) -> None:
    """n_tokens x 48 layers of reference-format records, written a chunk of tokens at a time."""
    rng = np.random.default_rng(seed)
    pop = 1.0 / np.arange(1, N_EXPERT + 1) ** 0.8
    pop /= pop.sum()
    perm = np.stack([rng.permutation(N_EXPERT) for _ in range(N_LAYER)])  # each layer its own hot experts
    offsets = np.array([0, 1, 3, 7, 12, 20, 30, 44])
    prev = rng.choice(N_EXPERT, size=N_LAYER, p=pop)
    with open(path, "wb") as f:
        for a in range(0, n_tokens, chunk):
            n = min(chunk, n_tokens - a)
            hot = rng.choice(N_EXPERT, size=(n, N_LAYER), p=pop)
            keep = rng.random((n, N_LAYER)) < 0.5
            for t in range(n):  # sticky: half the time the previous token's hot expert
                hot[t] = prev = np.where(keep[t], prev, hot[t])
            ids = perm[np.arange(N_LAYER)[None, :, None], (hot[:, :, None] + offsets) % N_EXPERT]
            rows = np.zeros((n, N_LAYER, 2 + 2 * K), dtype="<i4")  # weights: float32 zeros
            rows[:, :, 0], rows[:, :, 1], rows[:, :, 2:2 + K] = np.arange(N_LAYER), K, ids
            f.write(rows.tobytes())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gib", type=float, default=1.0, help="trace size in GiB (default 1)")
    ap.add_argument("--dir", help="where to write the trace (default: a temporary folder, removed after)")
    ap.add_argument("--keep", action="store_true", help="keep the trace")
    ap.add_argument("--slots", type=int, default=32, help="slots per layer for the replays (default 32 of 128)")
    ap.add_argument("--policies", default="lru,static", help="policies replayed over every token (default lru,static)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--write-only", nargs=2, metavar=("PATH", "TOKENS"), help=argparse.SUPPRESS)  # the child's job
    args = ap.parse_args()
    if args.write_only:
        write_synthetic(Path(args.write_only[0]), int(args.write_only[1]), args.seed)
        return

    layout = ExpertLayout(N_LAYER, N_EXPERT, K,
                          tuple(LayerExperts(il, N_EXPERT, BYTES_PER_EXPERT, "q8_0") for il in range(N_LAYER)))
    rec = record_bytes(K)
    n_tokens = int(args.gib * 2**30) // (rec * N_LAYER)
    n_records = n_tokens * N_LAYER
    folder = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="trace-throughput-"))
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "q30-synthetic.bin"
    rows: list[tuple[str, float, int]] = []  # stage, seconds, records
    peaks: list[float] = []

    def stage(name: str, records: int, fn):
        t0 = time.perf_counter()
        out = fn()
        rows.append((name, time.perf_counter() - t0, records))
        peaks.append(rss_mib())
        print(f"  {name}: {rows[-1][1]:.1f} s, peak RSS {peaks[-1]:.0f} MiB", file=sys.stderr, flush=True)
        return out

    base_rss = rss_mib()
    try:
        stage("write the synthetic trace (a child process; not a tool, not in the RSS)", n_records,
              lambda: subprocess.run([sys.executable, __file__, "--write-only", str(path), str(n_tokens),
                                      "--seed", str(args.seed)], check=True))
        size = path.stat().st_size
        routes = stage("read + validate (`read_routes`, 64Ki-record chunks)", n_records, lambda: read_routes(path, layout))
        profile = stage("rank the profile (`make_profile`)", n_records, lambda: make_profile(routes, layout)).ranked
        slots = {il: args.slots for il in range(N_LAYER)}
        for name in [p.strip() for p in args.policies.split(",") if p.strip()]:
            stage(f"replay `{name}`, {args.slots} slots per layer, every token", n_records,
                  lambda name=name: run_policy(name, routes, slots, N_EXPERT, profile))
        half = routes.n_tokens // 2
        mib = cache_bytes_for_slots(layout, args.slots, False) / MiB
        stage("`simulate --test` path (`simulate_sizes`: rank on one half, lru + static on the other)", n_records,
              lambda: simulate_sizes("synthetic", layout, [mib], routes.tokens(0, half),
                                     routes.tokens(half, routes.n_tokens), policies=("lru", "static")))
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(folder, ignore_errors=True)
        elif not args.keep:
            path.unlink(missing_ok=True)

    print(f"Measured {datetime.date.today().isoformat()} on {platform.node() or 'this machine'} "
          f"({os.cpu_count()} cores, Python {platform.python_version()}, numpy {np.__version__}).\n")
    print(f"Trace: {size / 2**30:.2f} GiB ({size:,} bytes), {n_records:,} records = {n_tokens:,} tokens x "
          f"{N_LAYER} layers, k = {K}, {N_EXPERT} experts. Compact routing in memory: "
          f"{routes.experts.nbytes / MiB:.0f} MiB of expert ids ({routes.experts.dtype}) + "
          f"{routes.computed.nbytes / MiB:.0f} MiB of flags. Process RSS before: {base_rss:.0f} MiB.\n")
    print("| stage | seconds | records/s | MiB/s of trace | peak RSS so far (MiB) | peak RSS / file size |")
    print("|---|---:|---:|---:|---:|---:|")
    for (name, secs, recs), peak in zip(rows, peaks):
        print(f"| {name} | {secs:.1f} | {recs / secs:,.0f} | {recs * rec / MiB / secs:,.0f} | {peak:.0f} | "
              f"{peak * MiB / size:.1%} |")


if __name__ == "__main__":
    main()
