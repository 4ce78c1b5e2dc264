"""llama-server with several requests decoding at once: aggregate decode tok/s and the cache's counters.

    python3 tests/gpu/serve_parallel.py MODEL --profile P.strp --cache-mib MIB [--parallel 4] [--rounds 3]

For each configuration (``--cpu-moe`` alone, then the hybrid cache with its profile, then upload mode), one
llama-server on 127.0.0.1 with ``--parallel N``; ``rounds`` times N requests at once (held-out corpus
paragraphs as prompts, ``-n`` tokens each at temperature 0.7), timed from the first request sent to the
last answer; aggregate decode tok/s = generated tokens / that time, and the server's own per-request
decode rates. After the rounds, the llamacpp:moe_cache_* counters from /metrics (refused lookups among them).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from llama_moe.server.process import free_port, launch, server_binary, stop_process
from llama_moe.synth.corpus import split_paragraphs


def _metrics(url: str) -> dict[str, float]:
    out = {}
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("llamacpp:moe_cache_") and "{" not in line:
            name, value = line.split()
            out[name.removeprefix("llamacpp:moe_cache_")] = float(value)
    return out


def run(model: Path, name: str, extra: list[str], parallel: int, rounds: int, n_gen: int, threads: int,
        log_dir: Path) -> str:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [str(server_binary()), "-m", str(model), "-ngl", "999", "-fit", "off", "--load-mode", "none", "-t", str(threads),
            "--parallel", str(parallel), "-c", str(parallel * 1024), "--metrics", "--host", "127.0.0.1",
            "--port", str(port), *extra]
    server = launch(args, url, log_dir / f"serve_{name}.log", timeout=300)
    prompts = split_paragraphs().test_paragraphs()
    try:
        def one(i: int) -> dict:
            body = {"prompt": prompts[i % len(prompts)], "n_predict": n_gen, "temperature": 0.7, "seed": i,
                    "ignore_eos": True, "cache_prompt": False}
            return requests.post(url + "/completion", json=body, timeout=600).json()

        one(0)  # warm-up, not counted
        agg, per = [], []
        with ThreadPoolExecutor(parallel) as pool:
            for r in range(rounds):
                t0 = time.monotonic()
                res = list(pool.map(one, range(1 + r * parallel, 1 + (r + 1) * parallel)))
                wall = time.monotonic() - t0
                agg.append(sum(x["timings"]["predicted_n"] for x in res) / wall)
                per += [x["timings"]["predicted_per_second"] for x in res]
        m = _metrics(url)
    finally:
        stop_process(server.proc)
    counters = ", ".join(f"{k} {int(v)}" for k, v in sorted(m.items()) if k.endswith("_total"))
    return (f"| {name} | {parallel} | {statistics.median(agg):.1f} ({max(agg) - min(agg):.1f}) | "
            f"{statistics.median(per):.1f} | {counters or '-'} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--profile", type=Path, required=True)
    ap.add_argument("--cache-mib", type=int, required=True)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=16)
    ap.add_argument("--log-dir", type=Path, default=Path("/tmp"))
    a = ap.parse_args(argv)
    cache = ["--cpu-moe", "--moe-cache-mib", str(a.cache_mib)]
    configs = [("cpu-moe", ["--cpu-moe"]),
               ("hybrid", [*cache, "--moe-cache-hybrid", "--moe-cache-profile", str(a.profile)]),
               ("upload", [*cache, "--moe-cache-profile", str(a.profile)])]
    print("| configuration | parallel | aggregate decode tok/s (spread) | per request tok/s | cache counters |")
    print("|---|---:|---:|---:|---|")
    for name, extra in configs:
        print(run(a.model, name, extra, a.parallel, a.rounds, a.n, a.t, a.log_dir), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
