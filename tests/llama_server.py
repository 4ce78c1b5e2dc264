"""Starting and stopping a real llama-server on 127.0.0.1 for the tests (files for its logs, bounded waits)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llama_moe import server_process
from llama_moe.server_process import free_port  # noqa: F401 (the tests' import)


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
    """The package's launcher with the cache in RAM (LLAMA_MOE_CACHE_DEVICE=CPU), as the tests run it."""
    server = server_process.start_server(binary, args, log, env={"LLAMA_MOE_CACHE_DEVICE": "CPU"})
    return server.proc, server.url


stop_server = server_process.stop_process
