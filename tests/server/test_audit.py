"""The audit log reader and checker (llama_moe.tools.server.audit, ``python -m llama_moe audit``) on hand-made logs that
follow the field list of docs/formats.md, then break it one way at a time. The real server's log is checked in
test_server.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llama_moe.errors import AuditError
from llama_moe.formats.audit import ExitRecord, LoadRecord, RequestRecord, parse_record, read_audit
from llama_moe.tools.server.audit import check_audit, summarize
from support.audit_log import EXPERT, Run

def write(path: Path, records: list[dict], tail: str = "") -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


def errors(path: Path) -> list[str]:
    return [str(i) for i in check_audit(path).errors]


def test_a_server_run_reads_checks_and_summarizes(tmp_path: Path) -> None:
    f = write(tmp_path / "a.jsonl", Run().all())
    audit = read_audit(f)
    assert [r.event for r in audit.records] == ["load", "ready", "request", "request", "request", "exit"]
    assert [r.line for r in audit.records] == [1, 2, 3, 4, 5, 6]
    load, req, end = audit.records[0], audit.records[2], audit.records[5]
    assert isinstance(load, LoadRecord) and load.model.n_layer == 6 and load.params.n_ctx == 512
    assert load.profile is None and load.devices == () and load.layers[0].resident == (0, 1, 2)
    assert isinstance(req, RequestRecord) and (req.req.hits, req.req.misses, req.req.bytes_upload) == (40, 24, 24 * EXPERT)
    assert isinstance(end, ExitRecord) and end.perf.gen_tps == 2253.5
    result = check_audit(f)
    assert result.ok and result.issues == () and len(result.runs) == 1
    (s,) = summarize(f)
    assert (s.pid, s.requests, s.n_prompt, s.n_gen, s.exited) == (4242, 3, 24, 48, True)
    assert (s.hits, s.misses, s.refused) == (3 + 40 + 52 + 61, 9 + 24 + 12 + 3, 4 + 6)
    assert s.hit_rate == pytest.approx(156 / (204 + 10))   # refused lookups in the denominator
    assert s.request_hit_rate == pytest.approx(153 / (192 + 6))
    assert req.req.refused == req.counters.refused - audit.records[1].counters.refused == 6
    assert s.bytes_upload == 48 * EXPERT and s.bytes_cpu == 0


def test_hybrid_runs_and_runs_without_ready(tmp_path: Path) -> None:
    run = Run(hybrid=True)
    completion = Run(pid=7)   # llama-completion: load and exit only
    recs = run.all() + [completion.load(), completion.exit()]
    assert check_audit(write(tmp_path / "a.jsonl", recs)).ok
    hybrid, plain = summarize(tmp_path / "a.jsonl")
    assert hybrid.hybrid and hybrid.bytes_cpu == 48 * EXPERT and hybrid.bytes_upload == 0
    assert plain.requests == 0 and plain.exited


def test_a_truncated_last_line_is_reported_not_fatal(tmp_path: Path) -> None:
    recs = Run().all()
    cut = json.dumps(recs[-1])[:57]   # killed while writing the exit record
    f = write(tmp_path / "a.jsonl", recs[:-1], tail=cut)
    audit = read_audit(f)   # strict, and still no exception
    assert len(audit.records) == 5
    (issue,) = audit.issues
    assert issue.line == 6 and issue.severity == "warning" and "truncated" in issue.message
    result = check_audit(f)
    assert result.ok
    assert any("no exit record" in i.message for i in result.issues)
    (s,) = summarize(f)
    assert not s.exited and s.requests == 3


def test_a_broken_line_in_the_middle_is_an_error(tmp_path: Path) -> None:
    recs = Run().all()
    f = tmp_path / "a.jsonl"
    f.write_text(json.dumps(recs[0]) + "\n" + json.dumps(recs[1])[:30] + "\n" +
                 "".join(json.dumps(r) + "\n" for r in recs[2:]))
    with pytest.raises(AuditError, match=r"line 2: not a JSON object") as exc:
        read_audit(f)
    assert exc.value.line == 2
    assert any(e.startswith("error: line 2: not a JSON object") for e in errors(f))


@pytest.mark.parametrize("mutate, line, field, message", [
    (lambda r: r[2].pop("req_misses"), 3, "req_misses", "missing"),
    (lambda r: r[1].update(hits="12"), 2, "hits", 'expected an integer, got string "12"'),
    (lambda r: r[1].update(pid=True), 2, "pid", "expected an integer, got boolean true"),
    (lambda r: r[3].update(misses=-1), 4, "misses", "expected an integer >= 0"),
    (lambda r: r[3].update(hybrid=0), 4, "hybrid", "expected true or false"),
    (lambda r: r[0]["model"].pop("n_layer"), 1, "model.n_layer", "missing"),
    (lambda r: r[0]["params"].update(n_ubatch=512.0), 1, "params.n_ubatch", "expected an integer, got number 512.0"),
    (lambda r: r[0]["layers"][1].update(resident=[1, "x"]), 1, "layers[1].resident", "expert ids"),
    (lambda r: r[0].update(profile={"path": "/p.strp", "bytes": 9, "sha256": "zz"}), 1, "profile.sha256",
     'expected 64 hex digits (the profile\'s SHA-256), got string "zz"'),
    (lambda r: r[0].update(profile={"path": "/p.strp", "bytes": 9, "sha256": "ab" * 31 + "zz"}), 1, "profile.sha256",
     "64 hex digits"),
    (lambda r: r[5]["perf"].pop("gen_tps"), 6, "perf.gen_tps", "missing"),
    (lambda r: r[0].update(profile=[]), 1, "profile", "expected an object or null"),
    (lambda r: r[2].update(time="2026-11-29 19:00:00"), 3, "time", "ISO 8601"),
    (lambda r: r[2].update(event="finish"), 3, "event", "unknown event 'finish'"),
])
def test_every_field_is_validated_and_named(tmp_path: Path, mutate, line: int, field: str, message: str) -> None:
    recs = Run().all()
    mutate(recs)
    f = write(tmp_path / "a.jsonl", recs)
    with pytest.raises(AuditError) as exc:
        read_audit(f)
    assert exc.value.line == line and exc.value.field == field
    assert f"line {line}: field '{field}'" in str(exc.value) and message in str(exc.value)
    assert any(f"line {line}: field '{field}'" in e for e in errors(f))


def test_parse_record_lists_every_problem_of_a_record() -> None:
    rec = Run().request(1, 1)
    del rec["slot"], rec["n_gen"]
    with pytest.raises(AuditError) as exc:
        parse_record(rec, 9)
    assert [f for f, _ in exc.value.problems] == ["slot", "n_gen"]
    assert str(exc.value) == "line 9: field 'slot': missing; field 'n_gen': missing"


def test_unknown_fields_are_warnings(tmp_path: Path) -> None:
    recs = Run().all()
    recs[2]["queue_ms"] = 3
    result = check_audit(write(tmp_path / "a.jsonl", recs))
    assert result.ok
    assert [str(i) for i in result.issues] == ["warning: line 3: fields docs/formats.md does not list: queue_ms"]


def test_counters_never_go_down(tmp_path: Path) -> None:
    recs = Run().all()
    recs[3]["misses"] = recs[2]["misses"] - 1
    assert "error: line 4: field 'misses' went down from 33 (line 3) to 32 within pid 4242" in errors(
        write(tmp_path / "a.jsonl", recs))


def test_one_slot_requests_add_up_to_exit_minus_ready(tmp_path: Path) -> None:
    recs = Run().all()
    recs[3]["req_hits"] += 1   # a request that counts one hit it did not make
    errs = errors(write(tmp_path / "a.jsonl", recs))
    assert "error: line 4: field 'req_hits': 53, but the context's hits moved by 52 since line 3 (one slot: they must be equal)" in errs
    assert ("error: line 6: field 'req_hits': the 3 requests of pid 4242 add up to 154, but hits moved by 153 "
            "from ready (line 2) to exit") in errs


def test_decodes_outside_requests_break_the_sums(tmp_path: Path) -> None:
    run = Run()
    recs = [run.load(), run.ready(), run.request(10, 5)]
    run._decode(4, 4)   # lookups no request record accounts for
    recs += [run.request(10, 5), run.exit()]
    errs = errors(write(tmp_path / "a.jsonl", recs))
    assert any("line 4: field 'req_misses': 5, but the context's misses moved by 9" in e for e in errs)
    assert any("line 5: field 'req_misses': the 2 requests of pid 4242 add up to 10, but misses moved by 14" in e
               for e in errs)


def test_overlapping_slots_check_only_the_lower_bound(tmp_path: Path) -> None:
    run = Run()
    recs = [run.load(), run.ready()]
    a, b = run.request(10, 4, slot=0), run.request(12, 6, slot=1)
    b.update(req_hits=22, req_misses=10)   # b overlapped a, so it counts a's lookups too
    recs += [a, b, run.exit()]
    result = check_audit(write(tmp_path / "a.jsonl", recs))
    assert result.ok
    assert any("slots [0, 1]" in i.message and i.severity == "warning" for i in result.issues)
    b.update(req_hits=1)   # less than the context moved: impossible even with overlaps
    assert any("field 'req_hits': the requests of pid 4242 add up to 11, less than the 22" in e
               for e in errors(write(tmp_path / "b.jsonl", recs)))


@pytest.mark.parametrize("order, message", [
    # a run without its load at the top of the file is a rotated log's (test_audit_rotation); later, an error
    (["load", "ready", "exit", "ready"], "line 4: 'ready' record of pid 4242 after its 'exit' (line 3)"),
    (["load", "request"], "line 2: 'request' record of pid 4242 before its 'ready' record"),
    (["load", "ready", "ready"], "line 3: a second 'ready' record for pid 4242"),
    (["load", "ready", "exit", "request"], "line 4: 'request' record of pid 4242 after its 'exit' (line 3)"),
])
def test_load_ready_request_exit_order(tmp_path: Path, order: list[str], message: str) -> None:
    run = Run()
    recs = [getattr(run, e)() if e != "request" else run.request(1, 1) for e in order]
    assert any(message in e for e in errors(write(tmp_path / "a.jsonl", recs)))


def test_counters_at_load_are_zero_and_layers_add_up(tmp_path: Path) -> None:
    recs = Run().all()
    recs[0]["hits"] = 4
    recs[5]["layers"][0]["misses"] += 2
    errs = errors(write(tmp_path / "a.jsonl", recs))
    assert "error: line 1: field 'hits': 4 at load, but load is written before any decode (expected 0)" in errs
    assert "error: line 1: field 'layers': the layers' hits add up to 0, but field 'hits' is 4" in errs
    assert "error: line 6: field 'layers': the layers' misses add up to 50, but field 'misses' is 48" in errs


def test_interleaved_processes_and_a_reload_in_one_file(tmp_path: Path) -> None:
    a, b = Run(pid=1), Run(pid=2)
    ra, rb = a.all(), b.all()
    interleaved = [x for pair in zip(ra, rb) for x in pair]
    again = Run(pid=1)   # the same process loads a model again: its counters restart, its clock goes on
    again.ms = a.ms
    f = write(tmp_path / "a.jsonl", interleaved + again.all())
    result = check_audit(f)
    assert result.ok, result.errors
    assert [(r.pid, r.records[0].line) for r in result.runs] == [(1, 1), (2, 2), (1, 13)]
    assert [s.requests for s in summarize(f)] == [3, 3, 3]


def test_cli_check_and_summary(tmp_path: Path) -> None:
    good = write(tmp_path / "good.jsonl", Run().all())
    bad_recs = Run().all()
    bad_recs[4]["req_hits_profile"] = 99
    bad = write(tmp_path / "bad.jsonl", bad_recs)

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "llama_moe", "audit", *args], capture_output=True, text=True,
                              timeout=60)

    ok = cli("check", str(good))
    assert ok.returncode == 0, ok.stderr
    note, verdict = ok.stdout.splitlines()
    assert verdict == f"{good}: 6 records, 1 run (pid 4242): OK"
    # the model its load record names is not here: the resident ids are not bounded by its experts, and it says so
    assert note.startswith(f"{good}: note: the model /models/tiny-q8_0.gguf (pid 4242's load record) is not readable")
    assert cli("check", "-q", str(good)).stdout.strip() == verdict  # -q: errors and the verdict only
    failed = cli("check", str(bad))
    assert failed.returncode == 1
    assert f"{bad}: error: line 5: field 'req_hits_profile': 99 is more than req_hits (61)" in failed.stdout
    assert failed.stdout.endswith(": 3 errors\n")
    table = cli("summary", str(good))
    assert table.returncode == 0
    header, row = table.stdout.splitlines()
    assert header.split()[:4] == ["pid", "start", "model", "mode"] and row.split()[:4] == ["4242", "2026-11-29T19:00:00.137Z", "tiny", "upload"]
    js = json.loads(cli("summary", "--json", str(good)).stdout)
    assert js[0]["requests"] == 3 and js[0]["hits"] == 156 and js[0]["exited"] is True
    missing = cli("summary", str(tmp_path / "nope.jsonl"))
    assert missing.returncode == 2 and "cannot read the audit log" in missing.stderr


def test_a_cut_record_followed_by_the_next_process_on_the_same_line(tmp_path: Path) -> None:
    killed, after = Run(pid=1), Run(pid=2)
    first = [killed.load(), killed.ready(), killed.request(5, 5)]
    cut = json.dumps(killed.request(5, 5))[:40]   # killed mid-write; the next process appends right after
    rest = after.all()
    f = tmp_path / "a.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in first) + cut + "".join(json.dumps(r) + "\n" for r in rest))
    result = check_audit(f)
    assert result.ok, result.errors
    assert any(i.line == 4 and "cut short" in i.message for i in result.issues)
    assert [(r.pid, len(r.records)) for r in result.runs] == [(1, 3), (2, 6)]


def test_logs_of_builds_before_refused_was_counted_still_check(tmp_path: Path) -> None:
    recs = Run().all()
    for r in recs:  # what a build before the refused counters wrote: no refused, req_refused, layers[].refused
        r.pop("refused"), r.pop("req_refused", None)
        for l in r.get("layers", []):
            l.pop("refused")
    result = check_audit(write(tmp_path / "old.jsonl", recs))
    assert result.ok and result.issues == ()   # no warning either: the fields are those docs/formats.md lists
    assert all(r.counters.refused == 0 for r in result.runs[0].records)


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r[5]["layers"][1].update(refused=r[5]["layers"][1]["refused"] + 3),
     "line 6: field 'layers': the layers' refused add up to 13, but field 'refused' is 10"),
    (lambda r: r[2].update(req_refused=5),
     "line 3: field 'req_refused': 5, but the context's refused moved by 6 since line 2 (one slot: they must be equal)"),
    (lambda r: r[4].update(refused=9),
     "line 5: field 'refused' went down from 10 (line 4) to 9 within pid 4242"),
    (lambda r: r[0].update(refused=1), "line 1: field 'refused': 1 at load, but load is written before any decode"),
    (lambda r: r[3].update(refused="7"), "line 4: field 'refused': expected an integer, got string"),
])
def test_refused_counters_are_checked(tmp_path: Path, mutate, message: str) -> None:
    recs = Run().all()
    mutate(recs)
    assert any(message in e for e in errors(write(tmp_path / "a.jsonl", recs))), errors(tmp_path / "a.jsonl")


def test_a_hybrid_run_refuses_nothing(tmp_path: Path) -> None:
    recs = Run(hybrid=True).all()
    assert check_audit(write(tmp_path / "ok.jsonl", recs)).ok
    for r in recs[1:]:
        r["refused"] = 2
    recs[5]["layers"][0]["refused"] = 2
    assert any("line 2: field 'refused': 2 in a hybrid run, which refuses no lookup" in e
               for e in errors(write(tmp_path / "bad.jsonl", recs)))


def test_a_profiles_hash_is_64_hex_digits(tmp_path: Path) -> None:
    recs = Run().all()
    recs[0]["profile"] = {"path": "/p.strp", "bytes": 9, "sha256": "0123456789abcdef" * 4}
    assert check_audit(write(tmp_path / "a.jsonl", recs)).ok


def test_resident_ids_are_in_the_layers_range_and_held_once(tmp_path: Path, tiny_model_path: Path) -> None:
    """The records do not say a layer's n_expert: the model the load record names says it (32 in the tiny
    model), or --model when that path is not here; without either only negative ids are caught."""
    recs = Run().all()
    recs[0]["model"]["path"] = str(tiny_model_path)
    recs[0]["layers"][1]["resident"] = [0, 32]
    recs[5]["layers"][0]["resident"] = [-1, 2, 2]
    f = write(tmp_path / "a.jsonl", recs)
    result = check_audit(f)
    assert [str(i) for i in result.errors] == [
        "error: line 1: field 'layers[1].resident': layer 1 holds expert id 32, outside 0..31 (the model's layer 1 "
        "has 32 experts)",
        "error: line 6: field 'layers[0].resident': layer 0 holds expert id -1, outside 0..31 (the model's layer 0 "
        "has 32 experts)",
        "error: line 6: field 'layers[0].resident': layer 0 holds expert 2 in more than one slot"]
    assert result.notes == ()
    recs[0]["model"]["path"] = "/models/elsewhere.gguf"
    f = write(tmp_path / "b.jsonl", recs)
    alone = check_audit(f)
    assert [str(i) for i in alone.errors] == [
        "error: line 6: field 'layers[0].resident': layer 0 holds expert id -1: an expert id is >= 0",
        "error: line 6: field 'layers[0].resident': layer 0 holds expert 2 in more than one slot"]
    assert "not against its experts per layer (give --model FILE)" in alone.notes[0]
    assert [str(i) for i in check_audit(f, tiny_model_path).errors] == [str(i) for i in result.errors]
    cli = subprocess.run([sys.executable, "-m", "llama_moe", "audit", "check", str(f), "--model", str(tiny_model_path)],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 1 and f"{f}: error: line 1: field 'layers[1].resident': layer 1 holds expert id 32" in cli.stdout
    missing = subprocess.run([sys.executable, "-m", "llama_moe", "audit", "check", str(f), "--model",
                              str(tmp_path / "nope.gguf")], capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "nope.gguf: not a readable GGUF model" in missing.stderr
