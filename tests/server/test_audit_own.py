"""The requests' own counters (own_*) in the audit log: each lookup is one request's, so with any number of
slots the requests' own counters add up exactly to what the context moved from ready to exit. Hand-made logs
here; the real server's, with 4 slots and requests cut mid-stream, in test_server_accounting.py."""
from __future__ import annotations

import json
from pathlib import Path

from llama_moe.formats.audit import OwnCounters, RequestRecord, read_audit
from llama_moe.tools.server.audit import check_audit, summarize
from support.audit_log import EXPERT, Run


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def overlapping(hybrid: bool = False) -> tuple[Run, list[dict]]:
    """Two requests on two slots that overlapped: each one's req_* counts the other's lookups too, its own_*
    only its share."""
    run = Run(hybrid=hybrid)
    recs = [run.load(), run.ready()]
    a, b = run.request(10, 4, slot=0, refused=2, own=True), run.request(12, 6, slot=1, own=True)
    b.update(req_hits=22, req_misses=10, req_refused=0 if hybrid else 2)
    b.update({"req_bytes_cpu" if hybrid else "req_bytes_upload": 10 * EXPERT})
    recs += [a, b, run.exit()]
    return run, recs


def test_own_counters_are_read(tmp_path: Path) -> None:
    _, recs = overlapping()
    req = read_audit(write(tmp_path / "a.jsonl", recs)).records[3]
    assert isinstance(req, RequestRecord) and req.own == OwnCounters(12, 6, 0, 6 * EXPERT, 0)
    old = Run().all()   # a build before own counters: None, not zeros
    assert all(r.own is None for r in read_audit(write(tmp_path / "old.jsonl", old)).records
               if isinstance(r, RequestRecord))


def test_overlapping_requests_own_counters_add_up_exactly(tmp_path: Path) -> None:
    _, recs = overlapping()
    result = check_audit(write(tmp_path / "a.jsonl", recs))
    assert result.ok and result.issues == (), result.issues   # no "only the lower bound" warning: own is exact
    (s,) = summarize(tmp_path / "a.jsonl")
    assert s.request_hit_rate == (10 + 12) / (10 + 4 + 2 + 12 + 6)   # over own, each lookup once


def test_own_counters_that_do_not_add_up_are_errors(tmp_path: Path) -> None:
    _, recs = overlapping()
    recs[3]["own_misses"] -= 1   # a lookup charged to nobody
    errs = [str(i) for i in check_audit(write(tmp_path / "a.jsonl", recs)).errors]
    assert any("line 5: field 'own_misses': the 2 requests of pid 4242 add up to 9, but misses moved by 10 from "
               "ready (line 2) to exit" in e for e in errs), errs
    _, recs = overlapping()
    recs[2]["own_hits"] = recs[2]["req_hits"] + 1
    errs = [str(i) for i in check_audit(write(tmp_path / "b.jsonl", recs)).errors]
    assert any("line 3: field 'own_hits': 11 is more than req_hits (10)" in e for e in errs), errs


def test_a_hybrid_uploads_for_no_request(tmp_path: Path) -> None:
    _, recs = overlapping(hybrid=True)
    assert check_audit(write(tmp_path / "a.jsonl", recs)).ok
    recs[2]["own_bytes_upload"] = 5
    recs[2]["req_bytes_upload"] = 5
    errs = [str(i) for i in check_audit(write(tmp_path / "b.jsonl", recs)).errors]
    assert any("field 'own_bytes_upload'" in e and "a hybrid uploads for no request" in e for e in errs), errs


def test_a_killed_run_checks_own_only_as_a_bound(tmp_path: Path) -> None:
    run = Run()
    recs = [run.load(), run.ready(), run.request(10, 4, own=True)]
    run._decode(3, 3)   # a request in flight when the server was killed: no record
    recs.append(run.request(5, 5, own=True))
    result = check_audit(write(tmp_path / "a.jsonl", recs))
    assert not [e for e in result.errors if "own_" in e.message], result.errors
