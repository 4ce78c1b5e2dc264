"""ggml rpc-servers on 127.0.0.1 for the tests: the binary next to the loaded libllama, one CPU thread each,
a bounded address space, logs in files, a bounded wait until each answers, and stopped at teardown."""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from llama_moe.errors import RpcServerError
from llama_moe.rpc import greet, parse_endpoint
from llama_moe.tools.server.process import free_port

RPC_SERVER = "ggml-rpc-server"
ADDRESS_SPACE_BYTES = 4 << 30  # a tiny model's layers and compute buffers need far less; a runaway is stopped
START_TIMEOUT_S = 30.0


def find_rpc_server_binary() -> Path:
    """ggml-rpc-server as the tools find it ($LLAMA_BIN, else next to the loaded libllama): build_native.py builds it
    with the library, so a missing one fails the test that needs it, never skips it."""
    from llama_moe._native.loader import llama_binary
    from llama_moe.errors import NativeLibraryError

    try:
        return llama_binary(RPC_SERVER)
    except NativeLibraryError as exc:
        pytest.fail(f"no {RPC_SERVER}: {exc} (build_native.py builds it with the library)")


def _preexec(parent: int):
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE_BYTES, ADDRESS_SPACE_BYTES))
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: never outlives the test run
        if os.getppid() != parent:
            os._exit(1)

    return preexec


@dataclass
class RpcServer:
    proc: subprocess.Popen
    endpoint: str
    log: Path

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()  # it keeps nothing worth an orderly exit
        self.proc.wait(timeout=30)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:] if self.log.is_file() else ""


def start_rpc_server(binary: Path, log: Path) -> RpcServer:
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen([str(binary), "-H", "127.0.0.1", "-p", str(port), "-t", "1"], stdout=out,
                                stderr=subprocess.STDOUT, preexec_fn=_preexec(os.getpid()))
    server = RpcServer(proc, f"127.0.0.1:{port}", log)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{binary.name} exited with {proc.returncode}:\n{server.tail()}")
        try:
            greet(parse_endpoint(server.endpoint), timeout_s=2.0)
            return server
        except RpcServerError:
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"{binary.name} did not answer within {START_TIMEOUT_S:g} s:\n{server.tail()}")
            time.sleep(0.1)
