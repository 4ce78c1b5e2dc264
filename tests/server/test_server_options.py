"""llama-server's options of ours as an operator meets them, and the answers to hostile input: --moe-cache-mib
read strictly (fractions allowed, never truncated), an audit log without a cache warned about, a cache too small
said with its real requirement, one load line at default verbosity, a refused profile in the log, /metrics and
the audit log, and HTTP 400 (not 500) for a request's own faults. A real llama-server on 127.0.0.1."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import requests

from llama_moe.formats.audit import LoadRecord, read_audit
from support.llama_server import find_server_binary, start_server, stop_server


@pytest.fixture(scope="module")
def server_binary(lib) -> Path:
    return find_server_binary()


def _refused_at_start(binary: Path, *args: str) -> str:
    proc = subprocess.run([str(binary), *args, "--port", "1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0, proc.stderr[-2000:]
    return proc.stderr


@pytest.mark.parametrize("bad", ["abc", "1.9x", "", "-1", "nan", "inf", "1e30", "0x10"])
def test_the_cache_size_is_read_strictly(server_binary, tiny_model_path, bad) -> None:
    err = _refused_at_start(server_binary, "-m", str(tiny_model_path), "--cpu-moe", "--moe-cache-mib", bad)
    assert (f"--moe-cache-mib {bad}: not a size in MiB from 0 to 16777216 (16 TiB; fractions allowed, 0 = no cache)"
            in err), err[-1500:]
    assert "stoi" not in err


def _load_of(binary: Path, model: Path, tmp_path: Path, *extra: str) -> tuple[LoadRecord, str]:
    """Starts a server, reads its load record and its log (default verbosity), stops it."""
    audit, log = tmp_path / "audit.jsonl", tmp_path / "server.log"
    proc, url = start_server(binary, ["-m", str(model), "--cpu-moe", "--no-repack", "--metrics",
                                      "--moe-cache-audit", str(audit), "-c", "512", "-np", "1", *extra], log)
    try:
        metrics = requests.get(url + "/metrics", timeout=30).text
    finally:
        stop_server(proc)
    load = read_audit(audit).records[0]
    assert isinstance(load, LoadRecord)
    return load, log.read_text(errors="replace") + "\n" + metrics


def test_a_fraction_of_a_mib_is_the_size_asked_for(server_binary, tiny_model_path, tmp_path) -> None:
    load, text = _load_of(server_binary, tiny_model_path, tmp_path, "--moe-cache-mib", "1.9")
    assert load.params.moe_cache_mib == 1.9   # not 1
    # 1.9 MiB holds 12 of the tiny model's 26 KB experts a layer; 1 MiB would hold 6
    assert load.cache.slots == 6 * 12, load.cache


def test_one_load_line_at_default_verbosity(server_binary, tiny_model_path, tmp_path) -> None:
    _, text = _load_of(server_binary, tiny_model_path, tmp_path, "--moe-cache-mib", "2")
    lines = [l for l in text.splitlines() if "llama_moe: MoE cache on:" in l]
    assert len(lines) == 1, text[-3000:]
    assert "MiB, 13 slots per layer in 6 layers (78 in all), upload mode, on CPU, no profile" in lines[0]


def test_a_refused_profile_is_said_everywhere(server_binary, tiny_model_path, tmp_path) -> None:
    bad = tmp_path / "bad.strp"
    bad.write_bytes(b"STRP" + b"\0" * 40)   # the magic, then a version the engine refuses
    load, text = _load_of(server_binary, tiny_model_path, tmp_path, "--moe-cache-mib", "2", "--moe-cache-profile",
                          str(bad))
    line = next(l for l in text.splitlines() if "llama_moe: MoE cache on:" in l)
    assert f"profile {bad} refused: " in line and "the cache starts empty" in line
    assert load.profile is not None and load.profile.refused and load.profile.sha256
    assert load.profile.refused in line
    assert "llamacpp:moe_cache_profile_refused 1" in text


def test_an_audit_log_without_a_cache_warns(server_binary, tiny_model_path, tmp_path) -> None:
    load, text = _load_of(server_binary, tiny_model_path, tmp_path)   # no --moe-cache-mib
    assert (f"--moe-cache-audit {tmp_path / 'audit.jsonl'}: the context has no MoE cache (--moe-cache-mib N with "
            f"--cpu-moe or --n-cpu-moe), so the audit log's counters all stay 0") in text
    assert load.cache.slots == 0


@pytest.mark.parametrize("option", [("--moe-cache-admit", "2"), ("--moe-cache-repartition", "16"),
                                    ("--moe-cache-peer", "CPU"), ("--moe-cache-hybrid",)])
def test_a_cache_option_without_a_size_says_so(server_binary, tiny_model_path, tmp_path, option) -> None:
    """Without --moe-cache-mib there is no cache: each cache option given is named in a warning at default
    verbosity, none taken silently."""
    _, text = _load_of(server_binary, tiny_model_path, tmp_path, *option)
    said = [l for l in text.splitlines() if "no effect without --moe-cache-mib (there is no cache)" in l]
    assert len(said) == 1 and option[0] in said[0], text[-3000:]


@pytest.mark.parametrize("hybrid", [False, True])
def test_a_cache_too_small_states_the_real_requirement(server_binary, tiny_model_path, tmp_path, hybrid) -> None:
    extra = ("--moe-cache-hybrid",) if hybrid else ()
    _, text = _load_of(server_binary, tiny_model_path, tmp_path, "--moe-cache-mib", "0.1", *extra)
    said = next(l for l in text.splitlines() if "cannot hold one expert per layer" in l)
    need = float(said.split("need at least ")[1].split(" MiB")[0])
    assert need > 0.1, said   # what it asks for really is more than it was given
    assert ("the hybrid's zero-filled null slot" in said) == hybrid
    assert "MoE cache off: --moe-cache-mib 0.1 asked for one" in text


# ----------------------------------------------------------------------------------------------- hostile input

@pytest.fixture(scope="module")
def plain_server(server_binary, tiny_model_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile")
    proc, url = start_server(server_binary, ["-m", str(tiny_model_path), "--cpu-moe", "--no-repack", "--moe-cache-mib",
                                             "2", "-c", "512", "-np", "1"], d / "server.log")
    yield url
    stop_server(proc)


@pytest.mark.parametrize("path, body, said", [
    ("/completion", b'{"prompt": "hi", "n_predict": ', "invalid request"),                # cut JSON
    ("/completion", b'not json at all', "invalid request"),
    ("/completion", b'{"prompt": "\xff\xfe\xfd", "n_predict": 4}', "invalid request"),     # invalid UTF-8
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\xc3\x28"}]}', "invalid request"),
    ("/detokenize", b'{"tokens": [999999]}', "token 999999 is not in the vocabulary"),
    ("/detokenize", b'{"tokens": [-5]}', "token -5 is not in the vocabulary"),
    ("/completion", b'{"prompt": "hi", "max_tokens": 1e12}', "but got 1000000000000.0"),
    ("/completion", b'{"prompt": "hi", "max_tokens": 1000000000000}', "but got 1000000000000"),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1e12}',
     "but got 1000000000000.0"),
    ("/completion", b'{"prompt": "hi", "n_predict": 2.5}', "Value must be a whole number"),
])
def test_hostile_input_is_a_bad_request(plain_server, path, body, said) -> None:
    r = requests.post(plain_server + path, data=body, headers={"Content-Type": "application/json"}, timeout=60)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert said in r.json()["error"]["message"], r.text[:300]
    assert "-2147483648" not in r.text
    assert requests.get(plain_server + "/health", timeout=10).status_code == 200


def test_a_whole_number_written_as_a_float_is_fine(plain_server) -> None:
    r = requests.post(plain_server + "/completion", json={"prompt": "hi", "n_predict": 4.0}, timeout=60)
    assert r.status_code == 200, r.text[:300]
    assert json.loads(r.text)["tokens_predicted"] <= 4
