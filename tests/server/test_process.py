"""The package's llama-server process objects: stop() twice is fine, a server that is forgotten is stopped when it
is collected (with a ResourceWarning), and one that fails to start is not left running behind the error."""
from __future__ import annotations

import gc
import os
import warnings
from pathlib import Path

import pytest

from llama_moe.errors import LlamaMoeError
from llama_moe.tools.errors import ServerStartError
from llama_moe.tools.server import process
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


def test_llama_bin_is_where_the_tools_find_llama_server(binary, tiny_model_path, tmp_path, monkeypatch) -> None:
    """$LLAMA_BIN names the folder of the llama.cpp programs the tools run: a real llama-server is started from it
    (here the build folder, under another name, so that the library's own folder would not pass), and serve's
    command names it."""
    import subprocess
    import sys

    import requests

    link = tmp_path / "bin"
    link.symlink_to(binary.parent, target_is_directory=True)
    monkeypatch.setenv("LLAMA_BIN", str(link))
    found = process.server_binary()
    assert found == link / "llama-server" and found != binary
    with process.start_server(found, _args(tiny_model_path), tmp_path / "s.log") as server:
        assert Path(os.readlink(f"/proc/{server.proc.pid}/exe")) == binary.resolve()
        assert server.proc.args[0] == str(link / "llama-server")
        r = requests.post(f"{server.url}/completion", json={"prompt": "The ship", "n_predict": 4, "ignore_eos": True, "temperature": 0}, timeout=60)
        assert r.status_code == 200 and r.json()["tokens_predicted"] == 4
    plan = subprocess.run([sys.executable, "-m", "llama_moe", "serve", str(tiny_model_path), "--dry-run"],
                          capture_output=True, text=True, timeout=300)
    assert plan.returncode == 0, plan.stderr
    assert f"command      {link / 'llama-server'} -m " in plan.stdout
    monkeypatch.delenv("LLAMA_BIN")
    assert process.server_binary() == binary  # unset: the one next to the loaded libllama


def test_a_bad_llama_bin_is_an_error_that_names_it(binary, tiny_model_path, tmp_path, monkeypatch) -> None:
    """A set $LLAMA_BIN that is not a folder, or lacks the program asked for, is an error naming the variable and
    the path: never a silent fallback to the library's folder."""
    import subprocess
    import sys

    from llama_moe._native.loader import llama_binary
    from llama_moe.errors import NativeLibraryError

    empty = tmp_path / "empty"
    empty.mkdir()
    not_x = tmp_path / "not-executable"
    not_x.mkdir()
    (not_x / "llama-server").write_bytes(binary.read_bytes())
    (not_x / "llama-server").chmod(0o644)
    cases = [(tmp_path / "nope", "does not exist"), (tiny_model_path, "is not a folder"),
             (empty, f"{empty / 'llama-server'} is missing"), (not_x, "is not an executable file")]
    for folder, why in cases:
        monkeypatch.setenv("LLAMA_BIN", str(folder))
        with pytest.raises(ServerStartError) as excinfo:
            process.server_binary()
        assert f"LLAMA_BIN={folder}: " in str(excinfo.value) and why in str(excinfo.value)
        with pytest.raises(NativeLibraryError) as excinfo:
            llama_binary("ggml-rpc-server")  # every program the tools run is looked for there
        assert f"LLAMA_BIN={folder}: " in str(excinfo.value)
        assert folder.is_file() or not folder.exists() or "ggml-rpc-server is missing" in str(excinfo.value)
    out = subprocess.run([sys.executable, "-m", "llama_moe", "serve", str(tiny_model_path), "--dry-run"],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "LLAMA_BIN": str(empty)})
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith(f"llama_moe serve: error: LLAMA_BIN={empty}: {empty / 'llama-server'} is missing")
    assert len(out.stderr.strip().splitlines()) == 1
