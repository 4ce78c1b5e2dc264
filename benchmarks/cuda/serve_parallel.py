"""llama-server with several requests decoding at once: aggregate decode tok/s and the cache's counters.

    python3 benchmarks/cuda/serve_parallel.py MODEL --profile P.strp --cache-mib MIB [--parallel 1,2,4] [--rounds 3]
        [--configs cpu-moe,hybrid,hybrid-no-mailbox,upload]

For each configuration (``--cpu-moe`` alone, the hybrid cache with its profile through the mailbox or the
scheduler, upload mode), one llama-server on 127.0.0.1 with as many slots as the largest count; for each count
N, ``rounds`` times N requests at once (held-out corpus paragraphs as prompts, ``-n`` tokens each at
temperature 0.7), timed from the first request sent to the last answer; aggregate decode tok/s = generated
tokens / that time, and the server's own per-request decode rates; the llamacpp:moe_cache_* counters from
/metrics over those rounds (refused lookups among them).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from llama_moe.tools.server.process import free_port, launch, server_binary, stop_process
from llama_moe.tools.synth.corpus import split_paragraphs


def _metrics(url: str) -> dict[str, float]:
    out = {}
    for line in requests.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("llamacpp:moe_cache_") and "{" not in line:
            name, value = line.split()
            out[name.removeprefix("llamacpp:moe_cache_")] = float(value)
    return out


def run(model: Path, name: str, extra: list[str], env: dict[str, str], parallel: list[int], rounds: int, n_gen: int,
        threads: int, log_dir: Path) -> list[str]:
    """One server with max(parallel) slots; for each count in parallel, rounds of that many requests at once."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    n_slots = max(parallel)
    args = [str(server_binary()), "-m", str(model), "-ngl", "999", "-fit", "off", "--load-mode", "none", "-t", str(threads),
            "--parallel", str(n_slots), "-c", str(n_slots * 1024), "--metrics", "--host", "127.0.0.1",
            "--port", str(port), *extra]
    server = launch(args, url, log_dir / f"serve_{name}.log", env=env, timeout=300)
    prompts = split_paragraphs().test_paragraphs()
    rows = []
    try:
        def one(i: int) -> dict:
            body = {"prompt": prompts[i % len(prompts)], "n_predict": n_gen, "temperature": 0.7, "seed": i,
                    "ignore_eos": True, "cache_prompt": False}
            return requests.post(url + "/completion", json=body, timeout=600).json()

        one(0)  # warm-up, not counted
        i = 1
        for n_par in parallel:
            before = _metrics(url)
            agg, per = [], []
            with ThreadPoolExecutor(n_par) as pool:
                for _ in range(rounds):
                    t0 = time.monotonic()
                    res = list(pool.map(one, range(i, i + n_par)))
                    i += n_par
                    wall = time.monotonic() - t0
                    if any("timings" not in x for x in res):
                        bad = next(x for x in res if "timings" not in x)
                        raise RuntimeError(f"{name}, {n_par} at once: a request failed: {str(bad)[:300]}")
                    agg.append(sum(x["timings"]["predicted_n"] for x in res) / wall)
                    per += [x["timings"]["predicted_per_second"] for x in res]
            after = _metrics(url)
            delta = {k: after[k] - before.get(k, 0) for k in after if k.endswith("_total")}
            counters = ", ".join(f"{k} {int(v)}" for k, v in sorted(delta.items()))
            rows.append(f"| {name} | {n_par} | {statistics.median(agg):.1f} ({max(agg) - min(agg):.1f}) | "
                        f"{statistics.median(per):.1f} | {counters or '-'} |")
    except Exception as e:  # a failed configuration is a row that says why, and the others still run
        rows.append(f"| {name} | - | FAILED: {str(e)[:300]} | - | - |")
    finally:
        stop_process(server.proc)
    return rows


CONFIGS = ("cpu-moe", "hybrid", "hybrid-no-mailbox", "upload")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--profile", type=Path, required=True)
    ap.add_argument("--cache-mib", type=int, required=True)
    ap.add_argument("--parallel", default="4", help="requests at once, comma-separated counts (one server per configuration)")
    ap.add_argument("--configs", default="cpu-moe,hybrid,upload", help=f"comma-separated, of {', '.join(CONFIGS)}")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=16)
    ap.add_argument("--log-dir", type=Path, default=Path("/tmp"))
    a = ap.parse_args(argv)
    parallel = [int(x) for x in a.parallel.split(",")]
    cache = ["--cpu-moe", "--moe-cache-mib", str(a.cache_mib)]
    hybrid = [*cache, "--moe-cache-hybrid", "--moe-cache-profile", str(a.profile)]
    configs = {"cpu-moe": (["--cpu-moe"], {}), "hybrid": (hybrid, {}),
               "hybrid-no-mailbox": (hybrid, {"LLAMA_MOE_CACHE_NO_MAILBOX": "1"}),
               "upload": ([*cache, "--moe-cache-profile", str(a.profile)], {})}
    print("| configuration | requests at once | aggregate decode tok/s (spread) | per request tok/s | cache counters |")
    print("|---|---:|---:|---:|---|")
    for name in a.configs.split(","):
        extra, env = configs[name]
        for row in run(a.model, name, extra, env, parallel, a.rounds, a.n, a.t, a.log_dir):
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
