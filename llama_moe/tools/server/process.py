"""A llama-server process on 127.0.0.1: found in $LLAMA_BIN or next to the loaded libllama, started with its logs in files,
waited for until healthy (bounded), and stopped with one SIGTERM so that it writes its exit records."""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import time
import warnings
import weakref
from dataclasses import dataclass
from pathlib import Path

import requests

from ...errors import NativeLibraryError
from ..errors import ServerStartError


def server_binary() -> Path:
    """The llama-server the tools run: in ``$LLAMA_BIN`` when it is set, else the one built with the loaded libllama
    (python -m llama_moe build, without --lib-only). ServerStartError, naming the path, when it is not there."""
    from ..._native import loader as _loader

    try:
        return _loader.llama_binary("llama-server")
    except NativeLibraryError as exc:
        if _loader.library_path() is None and not os.environ.get(_loader.BIN_ENV):
            raise  # no library to be next to: the loader's error says where it looked
        raise ServerStartError(str(exc)) from None


_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent: int):
    """A preexec function: the child gets SIGTERM when the process that started it dies, even by SIGKILL, so no
    llama-server outlives its wrapper holding the port (Linux; elsewhere, nothing). SIGTERM, not SIGKILL: the
    server still frees its context and writes its exit record."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        prctl = libc.prctl
    except (OSError, AttributeError):
        return None

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: nobody would signal the child
            os._exit(1)

    return preexec


def popen_tied(command: list[str], **kwargs) -> subprocess.Popen:
    """subprocess.Popen of a child that dies with this process (see _die_with_parent)."""
    return subprocess.Popen(command, preexec_fn=_die_with_parent(os.getpid()), **kwargs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen) -> int:
    """One SIGTERM (a second makes llama-server exit at once, without its exit record), then a kill."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait(timeout=30)


def _stop_forgotten(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        warnings.warn(f"llama-server (pid {proc.pid}) was not stopped; stopped by the garbage collector "
                      f"(use stop() or 'with')", ResourceWarning, stacklevel=2)
        stop_process(proc)


@dataclass
class RunningServer:
    """A started llama-server. stop() twice is fine; one that is forgotten is stopped when it is collected (or
    at interpreter exit), so no test or tool leaves a server running behind it."""

    proc: subprocess.Popen
    url: str
    log: Path   # llama.cpp logs to stderr; stdout goes beside it, with the suffix .out

    def __post_init__(self) -> None:
        # refers to the process, never to self: the finalizer must not keep the object alive
        self._finalizer = weakref.finalize(self, _stop_forgotten, self.proc)

    @property
    def stopped(self) -> bool:
        return self.proc.poll() is not None

    def stop(self) -> int:
        self._finalizer.detach()
        return stop_process(self.proc)

    def detach(self) -> subprocess.Popen:
        """Hands the process over to the caller, who stops it (stop_process): this object no longer will."""
        self._finalizer.detach()
        return self.proc

    def __enter__(self) -> "RunningServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server(binary: Path, args: list[str], log: Path, env: dict[str, str] | None = None,
                 timeout: float = 90.0) -> RunningServer:
    """Starts ``binary args --host 127.0.0.1 --port <free>`` and waits for /health."""
    port = free_port()
    return launch([str(binary), *args, "--host", "127.0.0.1", "--port", str(port)], f"http://127.0.0.1:{port}", log,
                  env, timeout)


def launch(command: list[str] | tuple[str, ...], url: str, log: Path, env: dict[str, str] | None = None,
           timeout: float = 90.0) -> RunningServer:
    """Starts a llama-server command line that listens at url and waits for its /health."""
    # files, not pipes: a chatty server never blocks on a full pipe
    with open(log.with_suffix(".out"), "wb") as out, open(log, "wb") as err:
        proc = popen_tied(list(command), env={**os.environ, **(env or {})}, stdout=out, stderr=err)
    server = RunningServer(proc, url, log)
    try:
        _wait_healthy(proc, url, log, timeout)
    except BaseException:  # not healthy, or Ctrl-C while waiting: no server is left running behind the error
        proc.kill()
        proc.wait(timeout=30)
        server.stop()
        raise
    return server


def _wait_healthy(proc: subprocess.Popen, url: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerStartError(f"llama-server exited with {proc.returncode}:\n{_tail(log)}")
        try:
            if requests.get(url + "/health", timeout=2).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    raise ServerStartError(f"llama-server not healthy after {timeout:.0f} s:\n{_tail(log)}")


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.is_file() else "(no log)"


def run_in_foreground(command: list[str] | tuple[str, ...], env: dict[str, str] | None = None) -> int:
    """Runs a llama-server command line in this terminal, handing it Ctrl-C and SIGTERM, until it exits; it dies
    with this process (a SIGKILL of it included). ``env`` is added to this process's environment."""
    proc = popen_tied(list(command), env={**os.environ, **(env or {})})
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda s, f: proc.send_signal(s))
    return proc.wait()
