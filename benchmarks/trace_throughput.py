"""Routing-trace throughput: how fast the tools stream, rank and replay a large trace, and in how much memory.

python benchmarks/trace_throughput.py [--gib 1] [--dir DIR] [--keep] [--slots 32] [--policies lru,static]
                                      [--kfold-policies lru,static] [--folds 10]

Writes a synthetic trace of Qwen3-30B-A3B's shape (48 MoE layers x 128 experts, top-8: 72 bytes a record)
of about --gib GiB into a temporary folder (or --dir), then, in this one process, as the tools run them on
trace files (streamed: ``TraceRoutes``): reads it through once, validated against the model's layout, counting
the selections, and ranks the profile from those counts (``make_profile``); replays every token through each
policy of --policies with that profile at --slots slots per layer, runs the ``simulate --test`` path
(``simulate_sizes``: ranked on the first half of the tokens, lru and static replayed on the second) and the
``simulate --kfold`` path (--folds folds over the whole trace, --kfold-policies), and last, for contrast,
reads the trace into memory (``read_routes``, the whole trace in memory, which the tools avoid by streaming). Prints a
Markdown table: seconds, trace records per second, and the peak RSS of the process during each stage (the
kernel's high-water mark, reset before each stage through /proc/self/clear_refs; where it cannot be reset,
``ru_maxrss``, the peak so far), beside the file's size; the trace is written by a child process, so that the generator's
memory is not counted. The routing is skewed and sticky like a real router's (a hot expert per token and
layer, kept from the previous token half the time, and seven fixed offsets from it); the policies' speed
depends on the hit rate, so read the figures for this routing. The file is read right after it is written:
from the page cache, not from the disk.
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

from llama_moe.tools.experts import ExpertLayout, LayerExperts  # noqa: E402
from llama_moe.tools.routing import TraceRoutes, make_profile, read_routes, run_policy, simulate_sizes  # noqa: E402
from llama_moe.tools.routing.budget import MiB, cache_bytes_for_slots  # noqa: E402
from llama_moe.formats.trace import record_bytes  # noqa: E402

N_LAYER, N_EXPERT, K = 48, 128, 8
BYTES_PER_EXPERT = 3 * 2048 * 768 * 34 // 32  # gate, up, down of one expert in q8_0 (only sizes the --cache-mib)


def rss_mib() -> float:
    """The process's peak RSS so far."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def reset_peak() -> bool:
    """Resets the kernel's high-water mark of this process's RSS (Linux 4.0+), so that the next reading is
    the peak since now."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_since_reset_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


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
    ap.add_argument("--kfold-policies", default="lru,static", help="policies of the k-fold stage (default lru,static; "
                    "empty: no k-fold stage)")
    ap.add_argument("--folds", type=int, default=10, help="folds of the k-fold stage (default 10)")
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
    rows: list[tuple[str, float, int, float]] = []  # stage, seconds, records, peak RSS in the stage
    can_reset = reset_peak()

    def stage(name: str, records: int, fn):
        reset_peak()
        t0 = time.perf_counter()
        out = fn()
        rows.append((name, time.perf_counter() - t0, records, peak_since_reset_mib() if can_reset else rss_mib()))
        print(f"  {name}: {rows[-1][1]:.1f} s, peak RSS {rows[-1][3]:.0f} MiB", file=sys.stderr, flush=True)
        return out

    base_rss = rss_mib()
    in_memory = ""
    try:
        stage("write the synthetic trace (a child process; not a tool, not in the RSS)", n_records,
              lambda: subprocess.run([sys.executable, __file__, "--write-only", str(path), str(n_tokens),
                                      "--seed", str(args.seed)], check=True))
        size = path.stat().st_size
        traces = TraceRoutes([path], layout)
        profile = stage("read + validate + count, rank the profile (`make_profile(TraceRoutes(...))`: one pass)",
                        n_records, lambda: make_profile(traces, layout)).ranked
        slots = {il: args.slots for il in range(N_LAYER)}
        for name in [p.strip() for p in args.policies.split(",") if p.strip()]:
            passes = "one pass per group of layers" if name == "belady" else "one pass"
            stage(f"replay `{name}`, {args.slots} slots per layer, every token ({passes})", n_records,
                  lambda name=name: run_policy(name, traces, slots, N_EXPERT, profile))
        half = traces.n_tokens // 2
        mib = cache_bytes_for_slots(layout, args.slots, False) / MiB
        stage("`simulate --test` path (`simulate_sizes`: rank on one half, lru + static on the other)", n_records,
              lambda: simulate_sizes("synthetic", layout, [mib], traces.tokens(0, half),
                                     traces.tokens(half, traces.n_tokens), policies=("lru", "static")))
        kpol = tuple(p.strip() for p in args.kfold_policies.split(",") if p.strip())
        if kpol:
            stage(f"`simulate --kfold {args.folds}` path (`simulate_sizes`: {' + '.join(kpol)}, and the in-sample "
                  f"static)", n_records,
                  lambda: simulate_sizes("synthetic", layout, [mib], traces, folds=args.folds, policies=kpol))
        routes = stage("for contrast: `read_routes` into memory (the in-memory path)", n_records,
                       lambda: read_routes(path, layout))
        in_memory = (f"{routes.experts.nbytes / MiB:.0f} MiB of expert ids ({routes.experts.dtype}) + "
                     f"{routes.computed.nbytes / MiB:.0f} MiB of flags")
        del routes
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(folder, ignore_errors=True)
        elif not args.keep:
            path.unlink(missing_ok=True)

    print(f"Measured {datetime.date.today().isoformat()} on {platform.node() or 'this machine'} "
          f"({os.cpu_count()} cores, Python {platform.python_version()}, numpy {np.__version__}).\n")
    print(f"Trace: {size / 2**30:.2f} GiB ({size:,} bytes), {n_records:,} records = {n_tokens:,} tokens x "
          f"{N_LAYER} layers, k = {K}, {N_EXPERT} experts. In memory (the last stage only): {in_memory}. "
          f"Process RSS before: {base_rss:.0f} MiB.\n")
    print(f"| stage | seconds | records/s | MiB/s of trace | peak RSS in the stage (MiB){'' if can_reset else ' (so far)'} "
          f"| peak RSS / file size |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, secs, recs, peak in rows:
        print(f"| {name} | {secs:.1f} | {recs / secs:,.0f} | {recs * rec / MiB / secs:,.0f} | {peak:.0f} | "
              f"{peak * MiB / size:.1%} |")
    streamed = [peak for name, _, _, peak in rows[1:-1]]
    print(f"\nPeak RSS of the streaming stages: {max(streamed):.0f} MiB ({max(streamed) * MiB / size:.1%} of the file).")


if __name__ == "__main__":
    main()
