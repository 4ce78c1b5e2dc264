"""The defaults as an operator meets them in llama-server and serve: --moe-cache-mode and --moe-cache-mib auto read
strictly, the load lines that say what the engine chose and from which figures, a flag that contradicts the mode,
the slow-link warning, and serve's plan with no cache option (auto mode, auto size). A real llama-server on
127.0.0.1 with the cache in RAM; the device's free memory and the link's rate come from the engine's test switches."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from llama_moe.tools.errors import ServePlanError
from llama_moe.tools.server.plan import plan_serve
from support.llama_server import find_server_binary, start_server, stop_server

SERVER = Path("/nonexistent/llama-server")  # plans only name it


@pytest.fixture(scope="module")
def server_binary(lib) -> Path:
    return find_server_binary()


@pytest.fixture(autouse=True)
def no_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("LLAMA_MOE_TEST_DEVICE_FREE_KIB", "LLAMA_MOE_TEST_COPY_GBPS"):
        monkeypatch.delenv(name, raising=False)


def _refused_at_start(binary: Path, *args: str) -> str:
    proc = subprocess.run([str(binary), *args, "--port", "1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0, proc.stderr[-2000:]
    return proc.stderr


@pytest.mark.parametrize("args, said", [
    (("--moe-cache-mode", "fast"), "--moe-cache-mode fast: not a mode: auto, upload, hybrid, adaptive or admit"),
    (("--moe-cache-mode", "Auto"), "--moe-cache-mode Auto: not a mode"),
    (("--moe-cache-mib", "Auto"), "--moe-cache-mib Auto: not a size in MiB from 0 to 16777216 (16 TiB; fractions allowed, "
                                  "0 = no cache), nor auto"),
    (("--moe-cache-margin-mib", "-1"), "--moe-cache-margin-mib -1: not a whole number from 0 to 1048576"),
    (("--moe-cache-margin-mib", "1.5"), "--moe-cache-margin-mib 1.5: not a whole number"),
    (("--moe-cache-margin-mib", "2000000"), "--moe-cache-margin-mib 2000000: not a whole number"),
])
def test_bad_values_stop_the_server_at_start(server_binary, tiny_model_path, args, said) -> None:
    err = _refused_at_start(server_binary, "-m", str(tiny_model_path), "--cpu-moe", *args)
    assert said in err, err[-1500:]


def _run(binary: Path, model: Path, tmp_path: Path, *extra: str) -> tuple[str, dict]:
    """Starts a server with the cache options given, and returns its log (default verbosity) and its audit log's load
    record, as JSON."""
    audit, log = tmp_path / "audit.jsonl", tmp_path / "server.log"
    proc, _ = start_server(binary, ["-m", str(model), "--cpu-moe", "--no-repack", "--moe-cache-device", "CPU", "--moe-cache-audit", str(audit),
                                    "-c", "512", "-np", "1", *extra], log)
    stop_server(proc)
    return log.read_text(errors="replace"), json.loads(audit.read_text().splitlines()[0])


def _line(text: str, marker: str) -> str:
    lines = [l for l in text.splitlines() if marker in l]
    assert len(lines) == 1, text[-3000:]
    return lines[0]


def test_auto_mode_says_what_it_chose(server_binary, tiny_model_path, tmp_path) -> None:
    text, load = _run(server_binary, tiny_model_path, tmp_path, "--moe-cache-mode", "auto", "--moe-cache-mib", "2")
    assert ", auto: hybrid, admitting, on CPU, no profile" in _line(text, "llama_moe: MoE cache on:")
    assert _line(text, "llama_moe: MoE cache chosen by the engine:").endswith(
        "mode auto: the hybrid, admitting its misses (the engine's budget)")
    assert load["params"]["moe_cache_mode"] == "auto" and load["params"]["moe_cache_mib_auto"] is False


def test_the_automatic_size_is_in_the_load_lines(server_binary, tiny_model_path, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LLAMA_MOE_TEST_DEVICE_FREE_KIB", str(300 * 1024))
    text, load = _run(server_binary, tiny_model_path, tmp_path, "--moe-cache-mib", "auto", "--moe-cache-margin-mib", "100")
    assert ", auto: hybrid, admitting, on CPU" in _line(text, "llama_moe: MoE cache on:")  # an automatic size alone: auto mode
    chosen = _line(text, "llama_moe: MoE cache chosen by the engine:")
    assert "mode auto: the hybrid, admitting its misses (the engine's budget); size auto: the cache takes " in chosen
    assert "CPU's free memory after the model, the KV cache and the compute buffers (" in chosen
    assert "less a margin of 100.00 MiB, at most what holds every layer whole" in chosen
    assert load["params"]["moe_cache_mib_auto"] is True and load["params"]["moe_cache_mib"] == pytest.approx(
        load["cache"]["bytes"] / 2**20)


def test_a_flag_that_contradicts_the_mode_is_ignored_and_said(server_binary, tiny_model_path, tmp_path) -> None:
    text, _ = _run(server_binary, tiny_model_path, tmp_path, "--moe-cache-mode", "upload", "--moe-cache-hybrid",
                   "--moe-cache-admit", "2", "--moe-cache-mib", "2")
    assert "--moe-cache-mode upload contradicts --moe-cache-hybrid, --moe-cache-admit, which are ignored" in text
    assert ", upload mode, on CPU" in _line(text, "llama_moe: MoE cache on:")


def test_a_slow_link_is_said_with_its_figures(server_binary, tiny_model_path, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("LLAMA_MOE_TEST_COPY_GBPS", "0.0005")
    text, _ = _run(server_binary, tiny_model_path, tmp_path, "--moe-cache-mib", "2")
    said = _line(text, "upload mode on a slow link: the link to CPU carries 0.00")
    assert " GB/s: an expert's upload (0.02 MiB) takes " in said
    assert "more than 2 times the CPU's product, so uploads cannot pay for themselves" in said
    assert ", upload mode, on CPU" in _line(text, "llama_moe: MoE cache on:")   # as asked


# ------------------------------------------------------------------------------------------------------ serve

def test_serve_without_cache_options_plans_auto_mode_and_auto_size(lib, tiny_model_path) -> None:
    out = subprocess.run([sys.executable, "-m", "llama_moe", "serve", str(tiny_model_path), "--dry-run", "--ctx", "1024",
                          "--cache-device", "CPU"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "MoE cache auto: what the device has free once llama-server has loaded the model" in out.stdout, out.stdout
    assert "mode         auto: the hybrid admitting its misses, the fastest mode measured" in out.stdout
    command = out.stdout.split("command", 1)[1]
    assert "--moe-cache-mib auto --moe-cache-margin-mib 400 --moe-cache-mode auto" in command


def test_serve_plans_on_a_gpu_with_the_estimate_and_the_words(tiny_model_path) -> None:
    plan = plan_serve(tiny_model_path, SERVER, gpu_free_mib=10_000, gpu_name="GPU0", n_ctx=1024)
    assert plan.cache_auto and plan.mode == "auto" and plan.cache_mib > 0   # the estimate, all experts here
    assert plan.command[-6:] == ("--moe-cache-mib", "auto", "--moe-cache-margin-mib", "400", "--moe-cache-mode", "auto")
    hybrid = plan_serve(tiny_model_path, SERVER, gpu_free_mib=10_000, gpu_name="GPU0", n_ctx=1024, hybrid=True,
                        extra=("--moe-cache-adaptive",))
    assert hybrid.mode == "flags" and "--moe-cache-mode" not in hybrid.command and "--moe-cache-hybrid" in hybrid.command
    fixed = plan_serve(tiny_model_path, SERVER, gpu_free_mib=10_000, gpu_name="GPU0", n_ctx=1024, cache_mib=3, mode="upload",
                       min_cache_mib=1)
    assert not fixed.cache_auto and fixed.command[-4:] == ("--moe-cache-mib", "3", "--moe-cache-mode", "upload")
    passed = plan_serve(tiny_model_path, SERVER, gpu_free_mib=10_000, gpu_name="GPU0", n_ctx=1024, extra=("--moe-cache-mib", "3"))
    assert not passed.cache_auto and "-- --moe-cache-mib 3 replaces the size llama-server would measure" in passed.describe()


@pytest.mark.parametrize("kw, said", [
    (dict(cache_auto=True, extra=("--moe-cache-mib", "3")), "--cache-mib auto and -- --moe-cache-mib 3 conflict"),
    (dict(cache_mib=3, extra=("--moe-cache-mib", "auto")), "--cache-mib 3 and -- --moe-cache-mib auto conflict"),
    (dict(cache_auto=True, cache_mib=3), "--cache-mib auto and --cache-mib 3 conflict"),
    (dict(mode="fast"), "--mode fast: not a mode: auto, upload, hybrid, adaptive, admit"),
    (dict(mode="admit", hybrid=True), "--hybrid and --mode admit conflict"),
    (dict(mode="auto", extra=("--moe-cache-mode", "upload")), "-- --moe-cache-mode upload and --mode auto conflict"),
    (dict(mode="auto", extra=("--moe-cache-adaptive",)), "--mode auto and -- --moe-cache-adaptive conflict"),
    (dict(margin_mib=1.5), "--margin-mib must be a whole number of MiB"),
])
def test_serve_refuses_what_conflicts(tiny_model_path, kw, said) -> None:
    with pytest.raises(ServePlanError, match=said.replace("(", r"\(")):
        plan_serve(tiny_model_path, SERVER, gpu_free_mib=10_000, gpu_name="GPU0", n_ctx=1024, **kw)


def test_serve_refuses_a_mode_that_is_not_one(lib, tiny_model_path) -> None:
    out = subprocess.run([sys.executable, "-m", "llama_moe", "serve", str(tiny_model_path), "--dry-run", "--mode", "fast"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--mode: invalid choice: 'fast'" in out.stderr, out.stderr
    out = subprocess.run([sys.executable, "-m", "llama_moe", "serve", str(tiny_model_path), "--dry-run", "--cache-mib", "lots"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "auto or a number of MiB, not 'lots'" in out.stderr, out.stderr
