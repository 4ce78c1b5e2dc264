"""Starting and stopping a real llama-server on 127.0.0.1 for the tests (files for its logs, bounded waits)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from llama_moe.tools.server import process as server_process
from llama_moe.tools.server.process import free_port


# Our patches' llama-server options (the common options patch): the tests' servers use them all.
OUR_OPTIONS = ("--moe-cache-mib", "--moe-cache-profile", "--moe-cache-hybrid", "--moe-cache-adaptive", "--moe-cache-audit")


def find_server_binary() -> Path:
    """llama-server as the tools find it ($LLAMA_BIN, else next to the loaded libllama). It is part of our build
    (build_native.py makes it with the library), so a missing binary or a missing option of ours fails the test that
    needs it: it never skips."""
    from llama_moe._native.loader import llama_binary
    from llama_moe.errors import NativeLibraryError

    try:
        binary = llama_binary("llama-server")
    except NativeLibraryError as exc:
        pytest.fail(f"no llama-server: {exc} (build_native.py builds it with the library)")
    helptext = subprocess.run([str(binary), "--help"], capture_output=True, text=True, timeout=60)
    missing = [o for o in OUR_OPTIONS if o not in helptext.stdout + helptext.stderr]
    if missing:
        pytest.fail(f"{binary} lacks {', '.join(missing)}: it was not built from these patches (build_native.py)")
    return binary


def start_server(binary: Path, args: list[str], log: Path) -> tuple[subprocess.Popen, str]:
    """The package's launcher with the cache in RAM (--moe-cache-device CPU, in its environment form), as the tests run it."""
    server = server_process.start_server(binary, args, log, env={"LLAMA_ARG_MOE_CACHE_DEVICE": "CPU"})
    return server.detach(), server.url  # the tests stop it themselves (stop_server)


stop_server = server_process.stop_process

__all__ = ["find_server_binary", "free_port", "start_server", "stop_server"]
