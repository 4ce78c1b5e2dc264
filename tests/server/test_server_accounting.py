"""A real llama-server with 4 slots under 40 concurrent requests, a few cut mid-stream, its audit log rotated
while it serves: every request's own counters (own_*) are its share of the lookups, so they add up exactly to
what the context counted from ready to exit; the per-sequence series of /metrics add up to the totals; the
rotated files check as one log, the newer one alone with a warning. The cache is in RAM (the tests' switch)."""
from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from llama_moe.formats.audit import ExitRecord, ReadyRecord, RequestRecord, read_audit
from llama_moe.tools.server.audit import check_audit
from llama_moe.tools.server.metrics import parse_moe_cache, parse_prometheus, parse_request_log_line
from support.llama_server import find_server_binary, start_server, stop_server

N_REQUESTS = 40
N_SLOTS = 4
CUT = {7, 19, 26, 33}   # streamed, and the client hangs up after a few tokens
TOPICS = ["The ship left the harbour", "Bread rises when", "A comet's tail", "To grow tomatoes", "The old bridge",
          "In the desert at night", "A violin string", "The river froze"]


def _ask(url: str, i: int) -> str:
    prompt = f"{TOPICS[i % len(TOPICS)]} ({i})"
    if i in CUT:
        with requests.post(url + "/completion", json={"prompt": prompt, "n_predict": 400, "stream": True},
                           stream=True, timeout=120) as r:
            r.raise_for_status()
            lines = r.iter_lines()
            for _ in range(3):   # a few tokens, then hang up
                next(lines)
        return "cut"
    r = requests.post(url + "/completion", json={"prompt": prompt, "n_predict": 8 + i % 17}, timeout=300)
    r.raise_for_status()
    return "done"


def _requests_logged(*paths: Path) -> int:
    n = 0
    for p in paths:
        if p.is_file():
            n += sum(1 for line in p.read_text().splitlines() if '"event":"request"' in line)
    return n


def _wait(what: str, ok, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ok():
            return
        time.sleep(0.2)
    pytest.fail(f"{what} not within {seconds:.0f} s")


@pytest.fixture(scope="module")
def soak(tmp_path_factory: pytest.TempPathFactory, lib, tiny_model_path: Path):
    d = tmp_path_factory.mktemp("soak")
    audit, rotated, log = d / "audit.jsonl", d / "audit.jsonl.1", d / "server.log"
    proc, url = start_server(find_server_binary(), [
        "-m", str(tiny_model_path), "--cpu-moe", "--no-repack", "--moe-cache-mib", "2", "--metrics",
        "--moe-cache-audit", str(audit), "-c", str(512 * N_SLOTS), "-np", str(N_SLOTS)], log)
    try:
        with ThreadPoolExecutor(N_SLOTS) as pool:
            first = list(pool.map(lambda i: _ask(url, i), range(N_REQUESTS // 2)))
            # rotation while the server runs: a mv and nothing else
            _wait("the first half's request records", lambda: _requests_logged(audit) == N_REQUESTS // 2)
            os.rename(audit, rotated)
            second = list(pool.map(lambda i: _ask(url, i), range(N_REQUESTS // 2, N_REQUESTS)))
        assert (first + second).count("cut") == len(CUT)
        _wait("every request's record, the cut ones' too",
              lambda: _requests_logged(rotated, audit) == N_REQUESTS)
        metrics = requests.get(url + "/metrics", timeout=30).text
    finally:
        rc = stop_server(proc)
    return dict(audit=audit, rotated=rotated, log=log.read_text(errors="replace"), metrics=metrics, rc=rc)


@pytest.mark.slow
def test_the_requests_own_counters_add_up_exactly(soak) -> None:
    records = read_audit(soak["rotated"]).records + read_audit(soak["audit"]).records
    ready = next(r for r in records if isinstance(r, ReadyRecord))
    end = records[-1]
    reqs = [r for r in records if isinstance(r, RequestRecord)]
    assert isinstance(end, ExitRecord) and soak["rc"] == 0
    assert len(reqs) == N_REQUESTS and len({r.slot for r in reqs}) == N_SLOTS
    assert all(r.own is not None for r in reqs)
    moved = end.counters - ready.counters
    for name in ("hits", "misses", "refused", "bytes_upload", "bytes_cpu"):
        own = sum(getattr(r.own, name) for r in reqs)
        assert own == getattr(moved, name), (name, own, getattr(moved, name))
        # the context's deltas over each request's life count the others' lookups: more than happened
        assert sum(getattr(r.req, name) for r in reqs) >= getattr(moved, name)
    assert moved.hits > 0 and moved.misses > 0 and moved.refused == 0   # too many experts: split, never refused
    assert sum(r.req.hits for r in reqs) > moved.hits   # the slots really overlapped
    assert all(getattr(r.own, n) <= getattr(r.req, n) for r in reqs for n in ("hits", "misses", "refused"))
    cut = [r for r in reqs if r.n_gen < 400 and r.n_gen >= 3 and r.t_gen_ms > 0]
    assert len(cut) >= len(CUT)


@pytest.mark.slow
def test_the_rotated_log_checks_as_one(soak) -> None:
    both = check_audit([soak["rotated"], soak["audit"]])
    assert both.ok and not both.issues, [str(i) for i in both.issues]
    alone = check_audit(soak["audit"])
    assert alone.ok, [str(i) for i in alone.errors]
    assert [i.severity for i in alone.issues if "starts mid-way" in i.message] == ["warning"]


@pytest.mark.slow
def test_each_request_logs_its_own_share(soak) -> None:
    lines = [l for l in soak["log"].splitlines() if "MoE cache hits = " in l]
    assert len(lines) == N_REQUESTS
    own = [parse_request_log_line(l) for l in lines]
    assert all(o is not None and o.own is not None for o in own), lines[:3]
    records = read_audit(soak["rotated"]).records + read_audit(soak["audit"]).records
    reqs = [r for r in records if isinstance(r, RequestRecord)]
    # every miss said where it went: uploaded, or computed on the CPU by the split
    assert sorted((o.own.hits, o.own.uploaded, o.own.cpu, o.own.refused) for o in own) == sorted(  # type: ignore[union-attr]
        (r.own.hits, r.own.uploads, r.own.cpu, r.own.refused) for r in reqs)
    assert all(r.own.misses == r.own.uploads + r.own.cpu for r in reqs)


@pytest.mark.slow
def test_the_sequences_series_add_up_to_the_totals(soak) -> None:
    c = parse_moe_cache(soak["metrics"])
    samples = parse_prometheus(soak["metrics"])
    per_seq: dict[str, dict[str, float]] = {}
    for s in samples:
        if s.name.startswith("llamacpp:moe_cache_seq_"):
            per_seq.setdefault(s.name, {})[s.label("seq")] = s.value
    assert set(per_seq["llamacpp:moe_cache_seq_hits_total"]) == {str(q) for q in range(N_SLOTS)}
    for series, total in (("hits", c.n_hit), ("misses", c.n_miss), ("refused", c.n_refused),
                          ("upload_bytes", c.n_bytes_upload), ("cpu_bytes", c.n_bytes_cpu)):
        assert sum(per_seq[f"llamacpp:moe_cache_seq_{series}_total"].values()) == total, series
    assert "llamacpp:moe_cache_profile_refused 0" in soak["metrics"]


def test_the_own_part_of_the_request_line_is_parsed() -> None:
    from llama_moe.tools.server.metrics import OwnShare, parse_request_log_line

    up = parse_request_log_line("0.08.054.425 I MoE cache hits = 59.2 % (255 hit, 0 from the profile, 109 uploaded: "
                                "2.7 MiB, 0.06 GiB/s), 67 refused; own: 50.0 % (40 hit, 30 uploaded: 0.7 MiB, 10 refused)")
    assert up is not None and up.refused == 67 and up.own == OwnShare(50.0, 40, 30, 0.7, 10, uploaded=30)
    hy = parse_request_log_line("MoE cache hits = 75.0 % (hybrid: 1858 on the GPU, 618 on the CPU, which read 15.4 MiB)"
                                "; own: 74.1 % (900 on the GPU, 300 on the CPU, which read 7.0 MiB)")
    assert hy is not None and hy.hybrid and hy.own == OwnShare(74.1, 900, 300, 7.0, 0, cpu=300, cpu_mib=7.0)
    older = parse_request_log_line("MoE cache hits = 61.3 % (38 hit, 4 from the profile, 24 uploaded: 0.60 MiB, 1.92 GiB/s)")
    assert older is not None and older.own is None
    # every miss where it went: uploaded or on the CPU (upload mode's split), on the CPU or on the peer (hybrid)
    up = parse_request_log_line("MoE cache hits = 59.2 % (255 hit, 0 from the profile, 109 uploaded: 2.7 MiB, 0.06 GiB/s), "
                                "5 on the CPU, which read 0.1 MiB, 0 refused; own: 50.0 % (40 hit, 30 uploaded: 0.7 MiB, "
                                "2 on the CPU, which read 0.1 MiB, 0 refused)")
    assert up is not None and (up.misses, up.uploaded, up.cpu, up.cpu_mib) == (114, 109, 5, 0.1)
    assert up.own == OwnShare(50.0, 40, 32, 0.7, 0, uploaded=30, cpu=2, cpu_mib=0.1)
    hy = parse_request_log_line("MoE cache hits = 75.0 % (hybrid: 1858 on the GPU, 618 on the CPU, which read 15.4 MiB, "
                                "12 on the peer); own: 74.1 % (900 on the GPU, 300 on the CPU, which read 7.0 MiB, 3 on the peer)")
    assert hy is not None and (hy.misses, hy.cpu, hy.peer) == (630, 618, 12)
    assert hy.own == OwnShare(74.1, 900, 303, 7.0, 0, cpu=300, cpu_mib=7.0, peer=3)
