"""serve (the plan and a real llama-server on 127.0.0.1) and check-api through the official clients."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from llama_moe.tools.server.check_api import check_api
from llama_moe.tools.errors import ServePlanError
from llama_moe.tools.server.plan import plan_serve
from llama_moe.tools.experts import expert_layout

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
    with pytest.raises(ServePlanError, match="needs a GPU, and none is visible .*--cache-device CPU runs"):
        plan_serve(tiny_model_path, SERVER, gpu_free_mib=None, gpu_name=None, cache_mib=100)


def test_cache_mib_sizes_a_cache_in_ram(tiny_model_path) -> None:
    """No GPU, the cache device the CPU (--cache-device CPU): --cache-mib is the size of the cache in RAM, and
    llama-server is told where it goes."""
    plan = plan_serve(tiny_model_path, SERVER, gpu_free_mib=None, gpu_name=None, n_ctx=1024, cache_mib=1.5,
                      cache_device="CPU")
    assert plan.cache_on and plan.cache_mib == 1.5
    i = plan.command.index("--moe-cache-mib")
    assert plan.command[i + 1] == "1.5" and plan.command.count("--moe-cache-mib") == 1
    assert "MoE cache 1.5 MiB" in plan.describe()
    assert "in RAM (--moe-cache-device CPU" in plan.describe()
    i = plan.command.index("--moe-cache-device")
    assert plan.command[i + 1] == "CPU"
    over = plan_serve(tiny_model_path, SERVER, gpu_free_mib=None, gpu_name=None, n_ctx=1024, cache_mib=1.5,
                      cache_device="CPU", extra=("--moe-cache-mib", "3"))
    assert over.cache_mib == 3 and "-- --moe-cache-mib 3 replaces --cache-mib 1.5" in over.describe()
    assert over.command.count("--moe-cache-mib") == 1


def test_a_server_reachable_from_the_network_without_a_key_is_warned_about(tiny_model_path) -> None:
    for host in ("127.0.0.1", "localhost", "::1", "127.0.0.2", "/tmp/llama.sock"):
        assert plan_serve(tiny_model_path, SERVER, gpu_free_mib=10_000, gpu_name="GPU0", n_ctx=1024,
                          host=host).warnings == (), host
    for host in ("0.0.0.0", "::", "192.168.1.5", "myhost"):
        plan = plan_serve(tiny_model_path, SERVER, gpu_free_mib=10_000, gpu_name="GPU0", n_ctx=1024, host=host, port=9000)
        (warning,) = plan.warnings
        assert warning.startswith(f"--host {host} listens beyond this machine and no API key is set: anyone who "
                                  f"reaches port 9000 can use the server")
        assert f"warning      {warning}" in plan.describe()
        assert plan_serve(tiny_model_path, SERVER, gpu_free_mib=10_000, gpu_name="GPU0", n_ctx=1024, host=host,
                          api_key="k").warnings == ()
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_API_KEY"}
    out = subprocess.run([sys.executable, "-m", "llama_moe", "serve", str(tiny_model_path), "--dry-run", "--json",
                          "--ctx", "1024", "--host", "0.0.0.0"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert "serve: warning: --host 0.0.0.0 listens beyond this machine and no API key is set" in out.stderr
    keyed = subprocess.run([sys.executable, "-m", "llama_moe", "serve", str(tiny_model_path), "--dry-run", "--ctx",
                            "1024", "--host", "0.0.0.0"], capture_output=True, text=True, timeout=60,
                           env={**env, "LLAMA_API_KEY": "k"})
    assert keyed.returncode == 0 and "warning" not in keyed.stderr + keyed.stdout, keyed.stderr


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


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _wait_healthy(port: int, proc: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"serve exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).ok:
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.3)
    pytest.fail(f"the server did not come up in {seconds:.0f} s")


def _gone(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":   # exited; its parent (init) has not reaped it yet
            return True
        time.sleep(0.2)
    return False


def test_serve_answers_the_official_clients_with_the_key_from_the_environment(lib, tiny_model_path) -> None:
    port = _free_port()
    env = {**os.environ, "LLAMA_API_KEY": "sekret-in-env"}
    # no GPU here: the cache given after -- runs in RAM, and check-api checks its series too
    proc = subprocess.Popen([sys.executable, "-m", "llama_moe", "serve", str(tiny_model_path), "--ctx", "1024", "--port",
                             str(port), "--alias", "tiny", "--cache-device", "CPU", "--", "--no-warmup", "--moe-cache-mib", "2",
                             "--no-repack"],
                            env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_healthy(port, proc)
        (child,) = _children(proc.pid)
        argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        assert b"llama-server" in argv[0] and not any(b"sekret" in a for a in argv), argv
        assert b"--api-key" not in argv
        checks = check_api(f"http://127.0.0.1:{port}", api_key="sekret-in-env", model="tiny", timeout=60)
        assert [c.name for c in checks if not c.ok] == [], checks
        # the key, four endpoints, a wrong key refused by both, the cache's series
        assert [c.name for c in checks][0] == "api key" and len(checks) == 8 and checks[-1].name == "moe cache"
        assert "requests without a key are refused" in checks[0].detail
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_a_killed_serve_takes_its_server_with_it(lib, tiny_model_path) -> None:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "llama_moe", "serve", str(tiny_model_path), "--ctx", "1024", "--port",
                             str(port), "--", "--no-warmup"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    child = None
    try:
        _wait_healthy(port, proc)
        (child,) = _children(proc.pid)
        proc.kill()   # SIGKILL: the wrapper cannot forward anything
        proc.wait(timeout=10)
        assert _gone(child, 30), f"llama-server (pid {child}) outlived its killed wrapper"
        with pytest.raises(requests.ConnectionError):
            requests.get(f"http://127.0.0.1:{port}/health", timeout=2)
    finally:
        if proc.poll() is None:
            proc.kill()
        if child is not None and not _gone(child, 0):
            os.kill(child, 9)


def test_the_plan_says_why_the_cache_is_off_without_a_gpu(tiny_model_path) -> None:
    profile = tiny_model_path.with_suffix(".strp")
    profile.write_bytes(b"STRP")   # the plan checks only that it exists
    plan = plan_serve(tiny_model_path, SERVER, gpu_free_mib=None, gpu_name=None, n_ctx=1024, profile=str(profile),
                      hybrid=True)
    text = plan.describe()
    assert not plan.cache_on and "MoE cache off: no GPU is visible" in text
    assert "note         --profile and --hybrid not passed: they need the MoE cache, which is off" in text
    assert "--moe-cache-mib" not in plan.command and "--moe-cache-profile" not in plan.command


def test_the_plan_reports_a_cache_given_after_the_double_dash(tiny_model_path) -> None:
    plan = plan_serve(tiny_model_path, SERVER, gpu_free_mib=None, gpu_name=None, n_ctx=1024,
                      extra=("--moe-cache-mib", "2", "--moe-cache-device", "CPU", "--no-repack"))
    assert plan.cache_on and plan.cache_mib == 2
    assert "MoE cache 2 MiB" in plan.describe() and "in RAM (--moe-cache-device CPU" in plan.describe()
    assert plan.command.count("--moe-cache-mib") == 1 and plan.command.count("--moe-cache-device") == 1
    off = plan_serve(tiny_model_path, SERVER, gpu_free_mib=None, gpu_name=None, n_ctx=1024, extra=("--moe-cache-mib", "2"))
    assert not off.cache_on and "llama-server turns a cache without one off" in off.describe()
    gpu = plan_serve(tiny_model_path, SERVER, gpu_free_mib=10_000, gpu_name="GPU0", n_ctx=1024,
                     extra=("--moe-cache-mib=3",))
    assert gpu.cache_mib == 3 and "replaces the size llama-server would measure" in gpu.describe()
    assert gpu.command.count("--moe-cache-mib") == 0 and not gpu.cache_auto
    for bad, msg in ((("--moe-cache-mib", "abc"), "not a number"), (("--moe-cache-mib",), "needs a value"),
                     (("--api-key", "k"), "LLAMA_API_KEY")):
        with pytest.raises(ServePlanError, match=msg):
            plan_serve(tiny_model_path, SERVER, gpu_free_mib=None, gpu_name=None, n_ctx=1024, extra=bad)


def test_the_key_is_never_in_the_plan(tiny_model_path) -> None:
    plan = plan_serve(tiny_model_path, SERVER, gpu_free_mib=10_000, gpu_name="GPU0", n_ctx=1024, api_key="sekret")
    assert plan.api_key_env and "sekret" not in plan.describe() and "sekret" not in " ".join(plan.command)
    assert "LLAMA_API_KEY=(the key, hidden)" in plan.describe()
