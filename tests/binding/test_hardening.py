"""Threads, lifecycles and faults: the context's lock serializes callers, objects free themselves at exit,
and a broken audit target or a vanished profile never takes the server down."""
from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
import requests

from llama_moe import Context, ContextParams, Model, ModelParams, Sampling
from llama_moe.tools.experts import expert_layout
from llama_moe.formats.profile import Profile, write_profile
from support.llama_server import find_server_binary, start_server, stop_server

RAM = ModelParams(cpu_moe=True, repack=False)


def test_stats_resident_and_rebalance_from_other_threads_while_decoding(lib, tiny_model_path) -> None:
    layout = expert_layout(tiny_model_path)
    params = ContextParams(n_ctx=2048, moe_cache_mib=1.5, moe_cache_hybrid=True, moe_cache_adaptive=True,
                           moe_cache_device="CPU")
    with Model(tiny_model_path, RAM) as model, Context(model, params) as ctx:
        errors: list[BaseException] = []
        seen: dict[int, list[tuple[int, int]]] = {}

        def poll(i: int) -> None:
            seen[i] = []
            try:
                for _ in range(15):  # a fixed amount of work: the generation below runs until every poller is done
                    s = ctx.moe_cache_stats()
                    seen[i].append((s.n_hit, s.n_miss))
                    layers = ctx.layer_stats()
                    assert sum(l.n_hit for l in layers) <= ctx.moe_cache_stats().n_hit  # never torn backwards
                    for l in layout.layers:
                        assert len(ctx.resident(l.il)) <= layers[0].n_slots
                    assert ctx.rebalance(4) >= 0
            except BaseException as exc:  # reported below, on the test's thread
                errors.append(exc)

        threads = [threading.Thread(target=poll, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        tokens = []
        for tok in ctx.generate("The ship left the harbour", 1500, Sampling(temperature=0.8, seed=1), stop_at_eog=False):
            tokens.append(tok)
            if not any(t.is_alive() for t in threads):
                break
        for t in threads:
            t.join(timeout=120)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads), "the pollers could not get the context while it decoded"
    assert [len(v) for v in seen.values()] == [15, 15, 15] and len(tokens) >= 1
    for polls in seen.values():  # each thread sees the counters only grow
        assert all(a <= c and b <= d for (a, b), (c, d) in zip(polls, polls[1:]))


def test_unclosed_objects_are_freed_at_interpreter_exit_without_noise(lib, tiny_model_path) -> None:
    code = ("from llama_moe import *\n"
            f"m = Model({str(tiny_model_path)!r}, ModelParams(cpu_moe=True))\n"
            "c = Context(m, ContextParams(n_ctx=256))\n"
            "c.decode(m.tokenize('hello there'))\n"
            "print('done')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "done"
    assert "Error" not in proc.stderr and "Traceback" not in proc.stderr and "Exception" not in proc.stderr


@pytest.fixture(scope="module")
def server_binary(lib) -> Path:
    return find_server_binary()


def test_a_full_disk_under_the_audit_log_is_reported_and_serving_goes_on(server_binary, tiny_model_path, tmp_path) -> None:
    log = tmp_path / "s.log"
    proc, url = start_server(server_binary, ["-m", str(tiny_model_path), "--cpu-moe", "--no-repack", "--moe-cache-mib",
                                             "2", "--moe-cache-audit", "/dev/full", "-c", "512"], log)
    try:
        for _ in range(2):
            r = requests.post(url + "/completion", json={"prompt": "The ship", "n_predict": 8}, timeout=60)
            assert r.status_code == 200
    finally:
        assert stop_server(proc) == 0
    text = log.read_text(errors="replace")
    assert "cannot append to the audit log /dev/full" in text
    assert text.count("cannot append to the audit log") == 1  # said once, not per record


def test_a_profile_deleted_under_a_running_server_changes_nothing(server_binary, tiny_model_path, tmp_path, monkeypatch) -> None:
    layout = expert_layout(tiny_model_path)
    profile = tmp_path / "p.strp"
    write_profile(profile, Profile(layout.n_layer, layout.n_expert, 4, tuple((l.il, e) for l in layout.layers for e in range(4))))
    proc, url = start_server(server_binary, ["-m", str(tiny_model_path), "--cpu-moe", "--no-repack", "--moe-cache-mib", "2",
                                             "--moe-cache-profile", str(profile), "--moe-cache-hybrid", "--metrics",
                                             "-c", "512"], tmp_path / "s.log")
    try:
        before = requests.post(url + "/completion", json={"prompt": "The ship", "n_predict": 12, "temperature": 0},
                               timeout=60).json()["content"]
        profile.unlink()  # the profile is read once, at load
        after = requests.post(url + "/completion", json={"prompt": "The ship", "n_predict": 12, "temperature": 0},
                              timeout=60).json()["content"]
        metrics = requests.get(url + "/metrics", timeout=30).text
    finally:
        stop_server(proc)
    assert before == after
    assert f"llamacpp:moe_cache_prefilled {4 * layout.n_moe_layers}" in metrics
