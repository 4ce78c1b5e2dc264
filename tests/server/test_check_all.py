"""``python -m llama_moe check-all``: the installation's checks on the real library, CPU then GPU (skipped here,
where there is none), each with its verdict and what it measured."""
from __future__ import annotations

import json
import subprocess
import sys

from support.llama_server import find_server_binary


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llama_moe", "check-all", *args], capture_output=True, text=True, timeout=900)


def test_every_check_passes_or_says_why_it_is_skipped(lib, tiny_model_path) -> None:
    find_server_binary()
    out = _run(str(tiny_model_path), "-n", "24", "--json")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    checks = {c["name"]: c for c in json.loads(out.stdout)}
    assert [c["status"] for c in checks.values()][:3] == ["PASS", "PASS", "PASS"]
    decoding = checks["decoding, the cache in RAM"]["detail"]
    assert decoding.count("tokens identical") == 3 and all(m in decoding for m in ("upload:", "hybrid:", "adaptive:"))
    assert "same text True, mailbox ran True" in checks["llama-server, the mailbox on the CPU"]["detail"]
    # this machine has no GPU: the GPU checks say so instead of passing
    gpu = [c for c in checks.values() if "GPU" in c["name"] or "VRAM" in c["name"]]
    assert gpu and all(c["status"] == "SKIP" and c["detail"] == "no GPU" for c in gpu)


def test_cpu_only_stops_after_the_cpu_checks_and_the_default_model_is_used(lib) -> None:
    find_server_binary()
    out = _run("--cpu-only", "-n", "8")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == "3 passed, 0 failed, 0 skipped"
    assert "VRAM" not in out.stdout


def test_bad_numbers_are_refused() -> None:
    out = _run("-n", "0")
    assert out.returncode == 2 and "error: -n must be >= 1, got 0" in out.stderr and "Traceback" not in out.stderr
