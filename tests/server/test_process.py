"""The package's llama-server process objects: stop() twice is fine, a server that is forgotten is stopped when it
is collected (with a ResourceWarning), and one that fails to start is not left running behind the error."""
from __future__ import annotations

import gc
import os
import warnings
from pathlib import Path

import pytest

from llama_moe.errors import LlamaMoeError, ServerStartError
from llama_moe.server import process
from support.llama_server import find_server_binary


@pytest.fixture(scope="module")
def binary(lib) -> Path:
    return find_server_binary()


def _args(model: Path) -> list[str]:
    return ["-m", str(model), "--cpu-moe", "--no-repack", "-c", "256", "-t", "2"]


def test_stop_twice_and_a_stopped_server(binary, tiny_model_path, tmp_path) -> None:
    server = process.start_server(binary, _args(tiny_model_path), tmp_path / "s.log")
    assert not server.stopped
    assert server.stop() == 0 and server.stopped
    assert server.stop() == 0  # twice is fine


def test_a_detached_server_is_the_caller_s_to_stop(binary, tiny_model_path, tmp_path) -> None:
    proc = process.start_server(binary, _args(tiny_model_path), tmp_path / "s.log").detach()
    gc.collect()  # the RunningServer is gone: the process is not stopped with it
    assert proc.poll() is None
    assert process.stop_process(proc) == 0


def test_a_forgotten_server_is_stopped_when_collected(binary, tiny_model_path, tmp_path) -> None:
    server = process.start_server(binary, _args(tiny_model_path), tmp_path / "s.log")
    proc = server.proc
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always", ResourceWarning)
        del server
        gc.collect()
    assert proc.poll() == 0, "the server was left running"  # one SIGTERM: it wrote its exit records
    assert [w.category for w in seen] == [ResourceWarning] and "was not stopped" in str(seen[0].message)


def test_a_server_that_does_not_start_is_not_left_running(binary, tiny_model_path, tmp_path) -> None:
    with pytest.raises(ServerStartError, match="llama-server exited with") as excinfo:
        process.start_server(binary, ["-m", str(tmp_path / "missing.gguf")], tmp_path / "s.log")
    assert isinstance(excinfo.value, LlamaMoeError)
    # not healthy in time: killed, not left behind
    before = _children()
    with pytest.raises(ServerStartError, match="not healthy after"):
        process.start_server(binary, _args(tiny_model_path), tmp_path / "t.log", timeout=0.01)
    assert _children() == before


def _children() -> set[int]:
    me = os.getpid()
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            found.add(int(stat.parent.name))
    return found
