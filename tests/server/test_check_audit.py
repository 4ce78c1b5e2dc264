"""``python -m llama_moe check-audit``: a real llama-server with the hybrid cache and an audit log, through the
mailbox (the CPU as its device here) and through the scheduler: the same text, logs that pass ``audit check``."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from llama_moe.tools.server.check_audit import PROMPTS, CheckAuditError, check_audit_run
from support.llama_server import find_server_binary



def test_the_mailbox_changes_no_text_and_both_logs_pass(lib, tiny_model_path, profile, tmp_path) -> None:
    find_server_binary()
    result = check_audit_run(tiny_model_path, profile, cache_mib=2, n_predict=16, workdir=tmp_path / "work", log=lambda s: None)
    assert result.ok, result
    mailbox, scheduler = result.runs
    assert mailbox.mailbox and not scheduler.mailbox and mailbox.texts == scheduler.texts
    assert len(mailbox.texts) == len(PROMPTS) and all(mailbox.texts)
    assert "hand-overs from the GPU" in mailbox.mailbox_line and "mailbox off" in scheduler.mailbox_line
    # load, ready, a request per prompt, exit
    assert mailbox.n_records == scheduler.n_records == len(PROMPTS) + 3 and not mailbox.errors
    assert sorted(p.name for p in (tmp_path / "work").glob("audit-*.jsonl")) == ["audit-mailbox.jsonl", "audit-scheduler.jsonl"]


def test_the_command_line_reports_and_refuses(lib, tiny_model_path, profile, tmp_path) -> None:
    find_server_binary()
    proc = subprocess.run([sys.executable, "-m", "llama_moe", "check-audit", str(tiny_model_path), str(profile), "--cache-mib",
                           "2", "-n", "8", "--json"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["ok"] and len(out["runs"]) == 2
    for argv, said in ((["--cache-mib", "0"], "--cache-mib must be > 0, got 0"), (["-n", "0"], "-n must be >= 1, got 0")):
        bad = subprocess.run([sys.executable, "-m", "llama_moe", "check-audit", str(tiny_model_path), str(profile), *argv],
                             capture_output=True, text=True, timeout=120)
        assert bad.returncode == 2 and said in bad.stderr and "Traceback" not in bad.stderr, bad.stderr
    with pytest.raises(CheckAuditError, match="no such file"):
        check_audit_run(tiny_model_path, tmp_path / "missing.strp")
