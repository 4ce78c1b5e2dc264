"""Speculative decoding with and without the MoE cache: one llama-server request at a time, greedy.

    python3 benchmarks/cuda/spec_speed.py MODEL --profile P.strp --cache-mib MIB [--draft DRAFT.gguf]
        [--configs vram,hybrid] [--specs none,ngram,draft] [--rounds 3] [-n 128]

For each configuration (all in VRAM; the hybrid cache of MIB with its profile, the other experts on the CPU) and
each kind of drafting (none; llama.cpp's n-gram drafts from the text so far; a small draft model with the target's
vocabulary, all on the GPU), one llama-server on 127.0.0.1; ``rounds`` requests per prompt (a held-out corpus
paragraph, and a repeated list that n-grams find again), temperature 0, ``-n`` tokens each. Reported: the median
decode tok/s the server measured, the drafted and accepted tokens, and the cache's hit rate over the requests
(llamacpp:moe_cache_* from /metrics). Drafting pays when the accepted tokens outweigh the verification ubatches'
cost, which with the cache includes the experts that the ubatch's extra rows select.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import requests

from llama_moe.tools.server.metrics import parse_moe_cache
from llama_moe.tools.server.process import free_port, launch, server_binary, stop_process
from llama_moe.tools.synth.corpus import split_paragraphs

REPEAT = ("one two three four five six seven eight nine ten, " * 8).strip()


def _lookups(url: str) -> tuple[int, int]:
    """The cache's hits and misses so far (0, 0 without a cache), as the server's /metrics says them."""
    c = parse_moe_cache(requests.get(url + "/metrics", timeout=10).text)
    return (c.n_hit, c.n_miss) if c is not None else (0, 0)


def run(model: Path, config: str, cache: list[str], spec: str, spec_args: list[str], prompts: dict[str, str],
        rounds: int, n_gen: int, threads: int, log_dir: Path) -> list[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [str(server_binary()), "-m", str(model), "-ngl", "999", "-fit", "off", "--load-mode", "none",
            "-t", str(threads), "--parallel", "1", "-c", "4096", "--metrics", "--host", "127.0.0.1", "--port", str(port),
            *cache, *spec_args]
    server = launch(args, url, log_dir / f"spec_{config}_{spec}.log", timeout=300)
    rows = []
    try:
        def one(prompt: str) -> dict:
            body = {"prompt": prompt, "n_predict": n_gen, "temperature": 0, "ignore_eos": True, "cache_prompt": False}
            res = requests.post(url + "/completion", json=body, timeout=600).json()
            if "timings" not in res:
                raise RuntimeError(f"a request failed: {str(res)[:300]}")
            return res

        one(prompts["corpus"])  # warm-up, not counted
        for name, prompt in prompts.items():
            before = _lookups(url)
            res = [one(prompt) for _ in range(rounds)]
            after = _lookups(url)
            rate = [r["timings"]["predicted_per_second"] for r in res]
            drafted = sum(r["timings"].get("draft_n", 0) for r in res)
            accepted = sum(r["timings"].get("draft_n_accepted", 0) for r in res)
            hits, misses = after[0] - before[0], after[1] - before[1]
            hit_rate = f"{hits / (hits + misses):.3f}" if hits + misses else "-"
            rows.append(f"| {config} | {spec} | {name} | {statistics.median(rate):.2f} ({max(rate) - min(rate):.2f}) | "
                        f"{drafted} | {accepted} | {hit_rate} | {int(hits + misses)} |")
    except Exception as e:  # a failed configuration is a row that says why, and the others still run
        rows.append(f"| {config} | {spec} | - | FAILED: {str(e)[:300]} | - | - | - | - |")
    finally:
        stop_process(server.proc)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--profile", type=Path, required=True)
    ap.add_argument("--cache-mib", type=int, required=True)
    ap.add_argument("--draft", type=Path, help="a draft model with the target's vocabulary (for --specs draft)")
    ap.add_argument("--configs", default="vram,hybrid")
    ap.add_argument("--specs", default="none,ngram,draft")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-t", type=int, default=16)
    ap.add_argument("--log-dir", type=Path, default=Path("/tmp"))
    a = ap.parse_args(argv)
    configs = {"vram": [],
               "hybrid": ["--cpu-moe", "--moe-cache-mib", str(a.cache_mib), "--moe-cache-hybrid",
                          "--moe-cache-profile", str(a.profile)]}
    specs = {"none": [],
             "ngram": ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8"],
             "draft": ["-md", str(a.draft), "--spec-type", "draft-simple", "--spec-draft-n-max", "4", "-ngld", "999"]}
    chosen = a.specs.split(",")
    if "draft" in chosen and (a.draft is None or not a.draft.is_file()):
        ap.error("--specs draft needs --draft, an existing draft model")
    for name in a.configs.split(",") + chosen:
        if name not in configs and name not in specs:
            ap.error(f"unknown configuration or drafting {name!r}: configs {', '.join(configs)}; specs {', '.join(specs)}")
    prompts = {"corpus": split_paragraphs().test_paragraphs()[0], "repeat": REPEAT}
    print("| configuration | drafting | prompt | decode tok/s (spread) | drafted | accepted | hit rate | lookups |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for config in a.configs.split(","):
        for spec in chosen:
            for row in run(a.model, config, configs[config], spec, specs[spec], prompts, a.rounds, a.n, a.t, a.log_dir):
                print(row, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
