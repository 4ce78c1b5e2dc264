"""Bounded fuzzing in every CI run: the native STRP loader under libFuzzer with ASan/UBSan, and the Python
readers of profiles, traces, GGUF headers and audit logs under hypothesis. Any crash fails the run."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llama_moe.errors import GgufError, ProfileError
from llama_moe.gguf_files.reader import read_gguf
from llama_moe.formats.profile import Profile, read_profile
from llama_moe.formats.trace import TraceError, read_trace
from support.patched import patched_tree

ROOT = Path(__file__).resolve().parents[2]
FUZZ_SECONDS = 20


@pytest.mark.skipif(shutil.which("clang++") is None, reason="clang++ (libFuzzer) is not installed; .ci/run installs it")
def test_native_profile_loader_survives_libfuzzer(tmp_path) -> None:
    exe = tmp_path / "fuzz_strp"
    src = patched_tree(tmp_path / "llama.cpp") / "src"
    subprocess.run(["clang++", "-g", "-O1", "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=undefined",
                    "-I", str(src), str(ROOT / "tests" / "fuzz" / "fuzz_strp.cpp"), str(src / "llama-moe-profile.cpp"),
                    "-o", str(exe)], check=True, capture_output=True)
    work = tmp_path / "corpus"
    work.mkdir()
    # A damaged count must never become a big allocation: any single malloc over 64 MiB fails the run. The RSS
    # limit is loose: under CI the sanitizers' own mappings reached 1.1 GiB of RSS with 24 MiB of live heap.
    env = {**os.environ, "ASAN_OPTIONS": "quarantine_size_mb=16"}
    proc = subprocess.run([str(exe), f"-max_total_time={FUZZ_SECONDS}", "-print_final_stats=1", "-rss_limit_mb=4096",
                           "-malloc_limit_mb=64",
                           f"-artifact_prefix={tmp_path}/", str(work), str(ROOT / "tests" / "fuzz" / "corpus_strp")],
                          capture_output=True, text=True, timeout=FUZZ_SECONDS + 120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = int(re.search(r"stat::number_of_executed_units:\s+(\d+)", proc.stderr).group(1))
    print(f"libFuzzer: {runs} inputs through the native STRP loader in {FUZZ_SECONDS} s, no crash")
    assert runs > 1000


FUZZ = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
GOOD_PROFILE_RANKED = tuple((l, (5 * l + i) % 32) for i in range(8) for l in range(6))
GOOD_PROFILE = Profile(6, 32, 8, GOOD_PROFILE_RANKED).to_bytes()


def _mutate(data: bytes, cuts: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for pos, value in cuts:
        if out:
            out[pos % len(out)] = value
    return bytes(out)


def _read_mutated(tmp_path, good: bytes, cuts, length: int) -> Profile | None:
    """The profile reader on good, mutated at cuts and cut at length: the profile, or None when it refused."""
    path = tmp_path / "p.strp"
    path.write_bytes(_mutate(good, cuts)[:length])
    try:
        return read_profile(path, 6, 32)
    except ProfileError:
        return None


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=8), st.integers(0, len(GOOD_PROFILE)))
def test_profile_reader_refuses_or_reads(tmp_path, cuts, length) -> None:
    p = _read_mutated(tmp_path, GOOD_PROFILE, cuts, length)
    assert p is None or all(0 <= il < 6 and 0 <= e < 32 for il, e in p.ranked)


GOOD_SLOTS_PROFILE = Profile(6, 32, 8, GOOD_PROFILE_RANKED, (4, 9, 0, 40, 1, 16)).to_bytes()


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=8),
       st.integers(0, len(GOOD_SLOTS_PROFILE)))
def test_profile_reader_refuses_or_reads_a_slot_section(tmp_path, cuts, length) -> None:
    p = _read_mutated(tmp_path, GOOD_SLOTS_PROFILE, cuts, length)
    assert p is None or p.layer_slots is None or len(p.layer_slots) == 6


@FUZZ
@given(st.binary(max_size=600))
def test_trace_reader_refuses_or_reads(tmp_path, data) -> None:
    path = tmp_path / "t.bin"
    path.write_bytes(data)
    try:
        records = read_trace(path, n_expert=32)
    except TraceError:
        return
    assert all(r.experts.min() >= 0 and r.experts.max() < 32 for r in records if r.experts.size)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 1_000_000), st.integers(0, 255)), max_size=6), st.integers(0, 4096))
def test_gguf_reader_refuses_or_reads(tmp_path, tiny_model_path, cuts, length) -> None:
    head = tiny_model_path.read_bytes()[:200_000]
    path = tmp_path / "m.gguf"
    path.write_bytes(_mutate(head, cuts)[: 24 + length * 40])
    try:
        read_gguf(path)
    except GgufError:
        pass


def _good_audit_log() -> bytes:
    from support.audit_log import Run

    run = Run(hybrid=True)
    lines = [run.load(), run.ready(), run.request(40, 12, 5), run.request(33, 7), run.exit()]
    return b"".join(json.dumps(r).encode() + b"\n" for r in lines)


GOOD_AUDIT = _good_audit_log()


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 100_000), st.integers(0, 255)), max_size=8), st.integers(0, len(GOOD_AUDIT)))
def test_audit_reader_and_checker_refuse_or_read(tmp_path, cuts, length) -> None:
    """Byte flips and cuts of a valid audit log: read (strict or not), checked and summarized, or refused with
    AuditError; never another exception."""
    from llama_moe.errors import AuditError
    from llama_moe.formats.audit import read_audit
    from llama_moe.tools.server.audit import check_audit, summarize

    path = tmp_path / "audit.jsonl"
    path.write_bytes(_mutate(GOOD_AUDIT, cuts)[:length])
    try:
        read_audit(path, strict=True)
    except AuditError:
        pass
    lenient = read_audit(path, strict=False)
    assert all(i.line >= 0 for i in lenient.issues)
    try:
        check_audit(path)
        summarize(path)
    except AuditError:
        pass


ODD_VALUES = st.sampled_from([None, -1, 0, 1e300, float("nan"), "x", [], {}, True, 2**70, [{"il": -5}], {"n_layer": "6"}])


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, 40), ODD_VALUES), min_size=1, max_size=4))
def test_audit_checker_refuses_or_reads_odd_fields(tmp_path, changes) -> None:
    """A valid log whose fields take values of the wrong type or range: checked, or refused with AuditError."""
    from llama_moe.errors import AuditError
    from llama_moe.formats.audit import read_audit
    from llama_moe.tools.server.audit import check_audit, summarize

    records = [json.loads(line) for line in GOOD_AUDIT.decode().splitlines()]
    for r, k, value in changes:
        record = records[r % len(records)]
        record[sorted(record)[k % len(record)]] = value
    path = tmp_path / "audit.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    read_audit(path, strict=False)
    try:
        check_audit(path)
        summarize(path)
    except AuditError:
        pass
