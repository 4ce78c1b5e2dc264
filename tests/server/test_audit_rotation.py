"""A rotated audit log (``mv a.jsonl a.jsonl.1`` while the server runs): the files checked as one log, in order,
and a file that starts mid-run checked from there with a warning. Hand-made logs here; the real server's rotation is
in test_server_accounting.py."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from llama_moe.errors import AuditError
from llama_moe.tools.server.audit import check_audit, summarize
from support.audit_log import Run


def write(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def rotated(tmp_path: Path, cut: int) -> tuple[Path, Path]:
    """One run's records, the first ``cut`` of them in the old file."""
    recs = Run().all()
    return write(tmp_path / "a.jsonl.1", recs[:cut]), write(tmp_path / "a.jsonl", recs[cut:])


@pytest.mark.parametrize("cut", [1, 2, 3, 5])
def test_the_files_in_order_are_one_log(tmp_path: Path, cut: int) -> None:
    old, new = rotated(tmp_path, cut)
    result = check_audit([old, new])
    assert result.ok, result.errors
    assert result.issues == ()
    assert len(result.runs) == 1 and result.n_records == 6
    (s,) = summarize([old, new])
    assert (s.requests, s.exited, s.model) == (3, True, "tiny")


@pytest.mark.parametrize("cut", [1, 2, 3, 5])
def test_a_file_that_starts_mid_run_warns(tmp_path: Path, cut: int) -> None:
    _, new = rotated(tmp_path, cut)
    result = check_audit(new)
    assert result.ok, result.errors
    (warning,) = [i for i in result.issues if "starts mid-way" in i.message]
    assert warning.severity == "warning" and warning.line == 1 and "load record is in an earlier file" in warning.message


def test_a_mid_run_file_is_still_checked_from_its_first_record(tmp_path: Path) -> None:
    recs = Run().all()
    recs[4]["req_hits"] += 1    # the third request claims a hit the context never counted
    recs[3]["misses"] = 0       # and the context's misses go down
    new = write(tmp_path / "a.jsonl", recs[2:])
    errs = [str(i) for i in check_audit(new).errors]
    assert any("line 2: field 'misses' went down" in e for e in errs), errs
    assert any("line 3: field 'req_hits'" in e for e in errs), errs


def test_issues_name_the_file_and_its_own_line(tmp_path: Path) -> None:
    recs = Run().all()
    recs[3]["hits"] = 0   # the second request's record, line 2 of the new file
    old, new = write(tmp_path / "a.jsonl.1", recs[:2]), write(tmp_path / "a.jsonl", recs[2:])
    errs = [i for i in check_audit([old, new]).errors]
    assert errs and all(e.path == str(new) for e in errs)
    assert any(e.line == 2 and "field 'hits' went down" in e.message for e in errs), errs


def test_a_run_without_load_in_a_later_file_is_an_error(tmp_path: Path) -> None:
    a, b = Run(pid=1), Run(pid=2)
    old = write(tmp_path / "a.jsonl.1", a.all())
    recs_b = b.all()
    new = write(tmp_path / "a.jsonl", recs_b[1:])   # pid 2's load is in neither file
    errs = [str(i) for i in check_audit([old, new]).errors]
    assert any("'ready' record of pid 2 before any 'load' record" in e for e in errs), errs


def test_the_same_file_twice_is_refused(tmp_path: Path) -> None:
    old, _ = rotated(tmp_path, 2)
    with pytest.raises(AuditError, match="given more than once"):
        check_audit([old, old])


def test_cli_checks_several_files(tmp_path: Path) -> None:
    old, new = rotated(tmp_path, 3)
    both = subprocess.run([sys.executable, "-m", "llama_moe", "audit", "check", str(old), str(new)],
                          capture_output=True, text=True, timeout=60)
    assert both.returncode == 0, both.stdout + both.stderr
    assert "6 records, 1 run (pid 4242): OK" in both.stdout
    alone = subprocess.run([sys.executable, "-m", "llama_moe", "audit", "check", str(new)],
                           capture_output=True, text=True, timeout=60)
    assert alone.returncode == 0, alone.stdout + alone.stderr
    assert f"{new}: warning: line 1: pid 4242's run starts mid-way" in alone.stdout
    summary = subprocess.run([sys.executable, "-m", "llama_moe", "audit", "summary", str(old), str(new)],
                             capture_output=True, text=True, timeout=60)
    assert summary.returncode == 0 and summary.stdout.count("\n") == 2, summary.stdout + summary.stderr


@pytest.mark.parametrize("cut", [2, 3, 5])
def test_files_given_newest_first_are_out_of_order(tmp_path: Path, cut: int) -> None:
    """Time never runs backwards within one process: the newest file first puts the older records after the
    newer ones of the same pid, and the check fails, naming both files and lines."""
    old, new = rotated(tmp_path, cut)
    result = check_audit([new, old])
    assert not result.ok
    (err,) = [e for e in result.errors if "time runs backwards" in e.message]
    assert err.path == str(old) and err.line == 1
    assert f"pid 4242's record before it (line {6 - cut} of {new})" in err.message
    assert "the files are not in order (give a rotated log oldest first" in err.message
    cli = subprocess.run([sys.executable, "-m", "llama_moe", "audit", "check", str(new), str(old)],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 1 and f"{old}: error: line 1: field 'time'" in cli.stdout


def test_time_running_backwards_within_one_file_is_an_error(tmp_path: Path) -> None:
    recs = Run().all()
    recs[3]["time"], recs[4]["time"] = recs[4]["time"], recs[3]["time"]
    (err,) = [e for e in check_audit(write(tmp_path / "a.jsonl", recs)).errors if "time" in e.message]
    assert err.line == 5 and err.message == (f"field 'time': {recs[4]['time']} is earlier than {recs[3]['time']}, "
                                             f"pid 4242's record before it (line 4): time runs backwards within one "
                                             f"process")
    other = Run(pid=7).all()  # another process's clock is its own: records interleave by pid
    mixed = [r for pair in zip(other, Run().all()) for r in pair]
    assert check_audit(write(tmp_path / "b.jsonl", mixed)).ok
