"""The main job as the README gives it: ``python -m llama_moe stats`` on the embedded default model runs the same
prompt and generation without the cache and with it, and shows what the cache did and that the tokens stayed."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest


def _stats(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llama_moe", "stats", "-n", "32", *args], capture_output=True,
                          text=True, env={**os.environ, **(env or {})}, timeout=600)


@pytest.fixture(scope="module")
def main_job(lib) -> subprocess.CompletedProcess:
    return _stats()


def test_the_main_job_runs_the_cache_beside_no_cache(main_job) -> None:
    assert main_job.returncode == 0, main_job.stderr[-2000:]
    out = main_job.stdout
    assert re.search(r"^\s+no cache\s+with the cache$", out, re.M)
    assert re.search(r"^generation\s+(\d+) tok, [\d.]+ tok/s\s+\1 tok, [\d.]+ tok/s$", out, re.M)
    assert "tokens       identical: the 32 generated tokens are the same with and without the cache" in out
    m = re.search(r"(\d+) hits of (\d+) lookups = (0\.\d{4}) \((\d+) admitted, (\d+) refused", out)
    assert m, out
    hits, lookups = int(m[1]), int(m[2])
    assert 0 < hits < lookups
    assert re.search(rf"^saved        {hits} of {lookups} expert lookups", out, re.M)


def test_the_main_job_shows_every_layer_hit(main_job) -> None:
    rows = re.findall(r"^\s+(\d+)\s+\d+\s+\d+\s+[\d,]+\s+\S+\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(0\.\d{3}|1\.000)$",
                      main_job.stdout, re.M)
    assert len(rows) == 6, main_job.stdout
    for il, slots, hits, misses, refused, rate in rows:
        assert int(slots) > 0 and int(hits) > 0, f"layer {il}: {slots} slots, {hits} hits"
        assert abs(float(rate) - int(hits) / (int(hits) + int(misses) + int(refused))) < 6e-4


def test_without_a_gpu_it_says_the_cache_is_in_ram(lib, main_job) -> None:
    from llama_moe.devices import gpus

    if gpus():
        pytest.skip("a GPU holds the cache here")
    assert "no GPU: the cache is in RAM (--moe-cache-device CPU)" in main_job.stdout


def test_the_main_job_as_json_and_one_run_without_the_cache(lib) -> None:
    js = _stats("--json")
    assert js.returncode == 0, js.stderr[-2000:]
    both = json.loads(js.stdout)
    assert both["identical"] and both["n_same"] == 32
    assert both["no_cache"]["cache"] is None and both["cache"]["cache"]["n_hit"] > 0
    assert both["no_cache"]["tokens"] == both["cache"]["tokens"]
    single = _stats("--moe-cache-mib", "0")
    assert single.returncode == 0, single.stderr[-2000:]
    assert "MoE cache    none" in single.stdout and "with the cache" not in single.stdout


def test_the_main_job_with_a_ram_tier_instead(lib) -> None:
    out = _stats("--moe-ram-mib", "1", "--json")
    assert out.returncode == 0, out.stderr[-2000:]
    both = json.loads(out.stdout)
    tier = both["cache"]["cache"]
    assert both["identical"] and both["no_cache"]["cache"] is None
    assert tier["ram_tier"] and tier["n_bytes_disk"] > 0 and 0 < tier["n_hit"]
    assert "RAM tier" in both["where"]
    # three tiers: the device cache (in RAM here) over the tier
    three = _stats("--moe-ram-mib", "1", "--moe-cache-mib", "2", "--json")
    assert three.returncode == 0, three.stderr[-2000:]
    both = json.loads(three.stdout)
    tiers = both["cache"]["cache"]
    assert both["identical"] and "three tiers" in both["where"]
    assert tiers["ram_below"] and tiers["ram_tier"] and tiers["n_ram_miss"] > 0 and tiers["n_bytes_disk"] > 0
