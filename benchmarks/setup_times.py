"""Setup costs a user pays: a cold build, a no-op rebuild, and importing llama_moe.

python benchmarks/setup_times.py [--source DIR|TARBALL] [--skip-cold]

The cold build runs in a fresh cache folder with ccache disabled; the no-op rebuild runs right after it.
Prints a Markdown table (paste it into benchmarks/setup_times.md).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def timed(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--source")
    ap.add_argument("--skip-cold", action="store_true")
    args = ap.parse_args()
    rows = []
    build = [sys.executable, str(ROOT / "build_native.py"), "--cpu", "--tests"] + (["--source", args.source] if args.source else [])
    if not args.skip_cold:
        with tempfile.TemporaryDirectory() as cache:
            env = {**os.environ, "LLAMA_MOE_CACHE_DIR": cache, "CCACHE_DISABLE": "1"}
            rows.append(("cold build (lib, server, cli, bench, completion, test-backend-ops)", timed(build, env)))
            rows.append(("no-op rebuild", statistics.median(timed(build, env) for _ in range(3))))
    imports = [timed([sys.executable, "-c", "import llama_moe"], dict(os.environ)) for _ in range(7)]
    bare = [timed([sys.executable, "-c", "pass"], dict(os.environ)) for _ in range(7)]
    rows.append(("python -c 'import llama_moe' (median of 7)", statistics.median(imports)))
    rows.append(("  of which the interpreter alone", statistics.median(bare)))
    loads = [timed([sys.executable, "-c", "import llama_moe; llama_moe.native_version()"], dict(os.environ)) for _ in range(5)]
    rows.append(("import and load the native library (median of 5)", statistics.median(loads)))
    print(f"machine: {os.cpu_count()} cores; {time.strftime('%Y-%m-%d')}\n")
    print("| step | seconds |\n|---|---:|")
    for name, sec in rows:
        print(f"| {name} | {sec:.2f} |")


if __name__ == "__main__":
    main()
