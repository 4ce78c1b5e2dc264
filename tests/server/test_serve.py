"""serve (the plan and a real llama-server on 127.0.0.1) and check-api through the official clients."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from llama_moe.server.check_api import check_api
from llama_moe.errors import ServePlanError
from llama_moe.server.plan import plan_serve
from llama_moe.experts import expert_layout

SERVER = Path("/nonexistent/llama-server")  # plans only name it


def test_the_plan_gives_the_cache_what_is_left(tiny_model_path) -> None:
    experts = expert_layout(tiny_model_path).total_expert_bytes / 2**20
    plan = plan_serve(tiny_model_path, SERVER, gpu_free_mib=10_000, gpu_name="GPU0", n_ctx=1024)
    assert plan.cache_mib == pytest.approx(experts)  # everything fits: all experts cached
    assert "--moe-cache-mib" in plan.command and "--cpu-moe" in plan.command and "-fit" in plan.command
    tight = plan_serve(tiny_model_path, SERVER, gpu_free_mib=plan.dense_mib + plan.kv_mib + plan.compute_mib + 400 + 3,
                       gpu_name="GPU0", n_ctx=1024, min_cache_mib=1)
    assert tight.cache_mib == pytest.approx(3, abs=0.01)
    prompt = plan_serve(tiny_model_path, SERVER, gpu_free_mib=10_000, gpu_name="GPU0", n_ctx=1024, favor="prompt")
    assert prompt.n_ubatch > plan.n_ubatch


def test_the_plan_refuses_what_cannot_fit(tiny_model_path) -> None:
    with pytest.raises(ServePlanError, match="does not fit GPU0"):
        plan_serve(tiny_model_path, SERVER, gpu_free_mib=100, gpu_name="GPU0", n_ctx=32768)
    with pytest.raises(ServePlanError, match="--cache-mib 5000 does not fit"):
        plan_serve(tiny_model_path, SERVER, gpu_free_mib=2000, gpu_name="GPU0", n_ctx=1024, cache_mib=5000)
    base = plan_serve(tiny_model_path, SERVER, gpu_free_mib=10_000, gpu_name="GPU0", n_ctx=1024)
    two_mib_left = base.dense_mib + base.kv_mib + base.compute_mib + base.margin_mib + 2  # less than the experts
    with pytest.raises(ServePlanError, match="less than --min-cache-mib"):
        plan_serve(tiny_model_path, SERVER, gpu_free_mib=two_mib_left, gpu_name="GPU0", n_ctx=1024, min_cache_mib=1500)
    with pytest.raises(ServePlanError, match="needs a GPU"):
        plan_serve(tiny_model_path, SERVER, gpu_free_mib=None, gpu_name=None, cache_mib=100)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_dry_run_prints_the_command(lib, tiny_model_path) -> None:
    out = subprocess.run([sys.executable, "-m", "llama_moe", "serve", str(tiny_model_path), "--dry-run", "--ctx", "1024",
                          "--port", "18555", "--", "--no-warmup"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    command = out.stdout.split("command", 1)[1]
    assert "llama-server" in command and f"-m {tiny_model_path}" in command and "--port 18555" in command
    assert command.strip().endswith("--no-warmup")


def test_serve_answers_the_official_clients(lib, tiny_model_path) -> None:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "llama_moe", "serve", str(tiny_model_path), "--ctx", "1024", "--port",
                             str(port), "--api-key", "sekret", "--alias", "tiny", "--", "--no-warmup"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                    break
            except requests.ConnectionError:
                time.sleep(0.3)
        else:
            pytest.fail("the server did not come up in 60 s")
        checks = check_api(f"http://127.0.0.1:{port}", api_key="sekret", model="tiny", timeout=60)
        assert [c.name for c in checks if not c.ok] == [], checks
        assert len(checks) == 6
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
