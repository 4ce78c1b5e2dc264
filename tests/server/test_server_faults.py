"""llama-server with the MoE cache under the official clients, parsers, load and faults (CPU as cache device)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from support.llama_server import find_server_binary, start_server, stop_server

SCALAR_SERIES = [
    "llamacpp:moe_cache_hits", "llamacpp:moe_cache_hits_profile", "llamacpp:moe_cache_misses",
    "llamacpp:moe_cache_upload_bytes", "llamacpp:moe_cache_cpu_bytes", "llamacpp:moe_cache_copies",
    "llamacpp:moe_cache_swaps", "llamacpp:moe_cache_hit_ratio", "llamacpp:moe_cache_slots", "llamacpp:moe_cache_prefilled",
    "llamacpp:moe_cache_bytes", "llamacpp:moe_cache_hybrid", "llamacpp:moe_cache_refused", "llamacpp:moe_cache_resident",
]
REFERENCE_SERIES = SCALAR_SERIES + [
    "llamacpp:moe_cache_layer_hits", "llamacpp:moe_cache_layer_hits_profile", "llamacpp:moe_cache_layer_misses",
    "llamacpp:moe_cache_layer_refused",
]


@pytest.fixture(scope="module")
def server_binary(lib) -> Path:
    return find_server_binary()


def _args(model: Path, audit: Path, *extra: str) -> list[str]:
    return ["-m", str(model), "--cpu-moe", "--no-repack", "--moe-cache-mib", "2", "--metrics", "--moe-cache-audit",
            str(audit), "-c", "2048", *extra]


def _audit_check(path: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llama_moe", "audit", "check", str(path)], capture_output=True,
                          text=True, timeout=60)


def test_prometheus_client_and_the_openai_client(server_binary, tiny_model_path, tmp_path) -> None:
    from openai import OpenAI
    from prometheus_client.parser import text_string_to_metric_families

    proc, url = start_server(server_binary, _args(tiny_model_path, tmp_path / "a.jsonl", "-np", "1"), tmp_path / "s.log")
    try:
        reply = OpenAI(base_url=url + "/v1", api_key="none", max_retries=0).chat.completions.create(
            model="tiny", max_tokens=12, messages=[{"role": "user", "content": "Tell me about the harbour."}])
        assert reply.choices[0].message.content.strip()
        families = {f.name: f for f in text_string_to_metric_families(requests.get(url + "/metrics", timeout=30).text)}
        for name in REFERENCE_SERIES:
            assert name in families, name
        value = {name: families[name].samples[0].value for name in SCALAR_SERIES}
        hits, misses, refused = (value[f"llamacpp:moe_cache_{n}"] for n in ("hits", "misses", "refused"))
        assert hits + misses > 0 and refused == 0   # the chat prompt's ubatch: more experts than a layer's slots, split
        assert value["llamacpp:moe_cache_hit_ratio"] == pytest.approx(hits / (hits + misses + refused))
        for name in ("hits", "refused"):
            per_layer = sum(s.value for s in families[f"llamacpp:moe_cache_layer_{name}"].samples
                            if s.name.endswith("_total"))
            assert per_layer == value[f"llamacpp:moe_cache_{name}"], name
    finally:
        stop_server(proc)


def test_a_server_killed_mid_request_leaves_a_readable_audit_log(server_binary, tiny_model_path, tmp_path) -> None:
    audit = tmp_path / "killed.jsonl"
    proc, url = start_server(server_binary, _args(tiny_model_path, audit, "-np", "1"), tmp_path / "s.log")
    try:
        requests.post(url + "/completion", json={"prompt": "The ship", "n_predict": 8}, timeout=60).raise_for_status()
        def long_request() -> None:
            try:
                requests.post(url + "/completion", json={"prompt": "The sea", "n_predict": 1500, "ignore_eos": True},
                              timeout=60)
            except requests.ConnectionError:
                pass  # the server is killed under it: that is the point

        long = threading.Thread(target=long_request, daemon=True)
        long.start()
        time.sleep(0.5)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    lines = audit.read_text().splitlines()
    records = [json.loads(line) for line in lines]  # every line parses
    assert [r["event"] for r in records][:3] == ["load", "ready", "request"] and records[-1]["event"] != "exit"
    check = _audit_check(audit)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "no exit record" in check.stdout + check.stderr


@pytest.mark.parametrize("bad, why", [("DIR", "is a directory"), ("/nonexistent/dir/audit.jsonl", "cannot append to it")])
def test_a_bad_audit_path_is_refused_at_start(server_binary, tiny_model_path, tmp_path, bad, why) -> None:
    path = str(tmp_path) if bad == "DIR" else bad
    proc = subprocess.run([str(server_binary), *_args(tiny_model_path, Path(path)), "--port", "1"], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode != 0
    assert f"--moe-cache-audit {path}: {why}" in proc.stderr


def test_four_slots_and_two_hundred_requests(server_binary, tiny_model_path, tmp_path) -> None:
    audit = tmp_path / "load.jsonl"
    proc, url = start_server(server_binary, _args(tiny_model_path, audit, "-np", "4"), tmp_path / "s.log")
    prompts = ["The ship left the harbour", "To grow tomatoes", "The telescope was pointed", "A melody in the night"]
    seen: list[tuple[float, float]] = []

    def one(i: int) -> int:
        r = requests.post(url + "/completion", json={"prompt": prompts[i % 4], "n_predict": 8, "seed": i}, timeout=60)
        return r.status_code

    def watch(stop: threading.Event) -> None:
        from llama_moe.tools.server.metrics import parse_moe_cache

        while not stop.is_set():
            m = parse_moe_cache(requests.get(url + "/metrics", timeout=30).text)
            seen.append((m.n_hit, m.n_miss))
            time.sleep(0.2)

    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(stop,), daemon=True)
    watcher.start()
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(8) as pool:
            codes = list(pool.map(one, range(200), timeout=240))
    finally:
        stop.set()
        watcher.join(timeout=30)
        stop_server(proc)
    assert codes == [200] * 200, f"{codes.count(200)} of 200 answered"
    assert time.monotonic() - started < 240
    assert len(seen) >= 2
    # each counter on its own: (hits, misses) tuples order by hits first, so falling misses would pass
    for counter, series in zip(("n_hit", "n_miss"), zip(*seen)):
        assert all(a <= b for a, b in zip(series, series[1:])), (counter, series)
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert sum(r["event"] == "request" for r in records) == 200 and records[-1]["event"] == "exit"
    check = _audit_check(audit)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize("bad", ["2junk", "-1", "", "12345", "1.5", "AUTO"])
def test_a_bad_admission_count_is_refused_at_start(server_binary, tiny_model_path, tmp_path, bad) -> None:
    proc = subprocess.run([str(server_binary), *_args(tiny_model_path, tmp_path / "a.jsonl"), "--moe-cache-hybrid",
                           "--moe-cache-admit", bad, "--port", "1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert f"--moe-cache-admit {bad}: not a count of experts from 0 to 9999" in proc.stderr


@pytest.mark.parametrize("admit", ["2", "auto"])
def test_admission_in_the_server_counts_and_is_audited(server_binary, tiny_model_path, tmp_path, admit) -> None:
    """The hybrid admitting its misses behind llama-server: the audit's load record names the setting (-1 for
    auto), the exit summary counts the admissions (and, chosen by the engine, the budget it chose), and the
    audit log passes its check."""
    audit, log = tmp_path / "audit.jsonl", tmp_path / "server.log"
    proc, url = start_server(server_binary, _args(tiny_model_path, audit, "--moe-cache-hybrid", "--moe-cache-admit", admit, "-v"),
                             log)
    try:
        r = requests.post(f"{url}/completion", json={"prompt": "The ship left the harbour", "n_predict": 48,
                                                      "temperature": 0.8, "seed": 1}, timeout=120)
        assert r.status_code == 200, r.text
        from llama_moe.tools.server.metrics import parse_moe_cache
        metrics = parse_moe_cache(requests.get(f"{url}/metrics", timeout=30).text)
    finally:
        stop_server(proc)
    assert metrics is not None and metrics.hybrid and metrics.n_admit > 0 and metrics.n_hit > 0
    records = [json.loads(line) for line in audit.read_text().splitlines()]
    assert records[0]["params"]["moe_cache_admit"] == (-1 if admit == "auto" else 2)
    assert records[0]["params"]["moe_cache_hybrid"] is True
    text = log.read_text()
    if admit == "auto":
        assert "as many per layer (up to 4) as the measured copies fit in half a decode" in text
        assert "admission's budget, chosen by the engine: " in text
    else:
        assert "hybrid MoE cache admits up to 2 missed experts per layer between two decodes" in text
    admitted = [line for line in text.splitlines() if "llama_moe_cache: admission:" in line]
    assert admitted and int(admitted[-1].split("admission: ")[1].split()[0]) > 0, admitted
    check = _audit_check(audit)
    assert check.returncode == 0, check.stdout + check.stderr
