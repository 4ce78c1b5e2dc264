"""Starting and stopping a real llama-server on 127.0.0.1 for the tests (files for its logs, bounded waits)."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]



def find_server_binary() -> Path:
    """llama-server next to the loaded libllama, if it is built with patch 0005 (--moe-cache-audit)."""
    import llama_moe

    binary = Path(llama_moe.native_version()["path"]).parent / "llama-server"
    if not binary.is_file():
        pytest.skip(f"no llama-server next to the loaded libllama ({binary})")
    helptext = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    if "--moe-cache-audit" not in helptext.stdout + helptext.stderr:
        pytest.skip("llama-server has no --moe-cache-audit: patch 0005-moe-cache-server.patch is not built yet")
    return binary


def start_server(binary: Path, args: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "LLAMA_MOE_CACHE_DEVICE": "CPU"}
    # files, not pipes: a chatty server never blocks on a full pipe. llama.cpp logs to stderr.
    with open(log.with_suffix(".out"), "wb") as out, open(log, "wb") as err:
        proc = subprocess.Popen([str(binary), *args, "--host", "127.0.0.1", "--port", str(port)], env=env,
                                stdout=out, stderr=err)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"llama-server exited with {proc.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except requests.RequestException:
            pass
        time.sleep(0.2)
    proc.kill()
    proc.wait(timeout=30)
    raise AssertionError(f"llama-server not healthy after 90 s:\n{log.read_text(errors='replace')[-3000:]}")


def stop_server(proc: subprocess.Popen) -> int:
    """One SIGTERM (a second makes llama-server exit at once, without its exit record), then a kill if needed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(timeout=30)


