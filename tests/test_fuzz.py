"""Bounded fuzzing in every CI run: the native STRP loader under libFuzzer with ASan/UBSan, and the Python
readers of profiles, traces and GGUF headers under hypothesis. Any crash fails the run."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llama_moe.errors import GgufError, ProfileError
from llama_moe.gguf.reader import read_gguf
from llama_moe.profile import Profile, read_profile
from llama_moe.trace import TraceError, read_trace

ROOT = Path(__file__).resolve().parent.parent
FUZZ_SECONDS = 20


@pytest.mark.skipif(shutil.which("clang++") is None, reason="clang++ (libFuzzer) is not installed; .ci/run installs it")
def test_native_profile_loader_survives_libfuzzer(tmp_path) -> None:
    exe = tmp_path / "fuzz_strp"
    src = ROOT / "patches" / "files" / "src"
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
GOOD_PROFILE = Profile(6, 32, 8, tuple((l, (5 * l + i) % 32) for i in range(8) for l in range(6))).to_bytes()


def _mutate(data: bytes, cuts: list[tuple[int, int]]) -> bytes:
    out = bytearray(data)
    for pos, value in cuts:
        if out:
            out[pos % len(out)] = value
    return bytes(out)


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=8), st.integers(0, len(GOOD_PROFILE)))
def test_profile_reader_refuses_or_reads(tmp_path, cuts, length) -> None:
    path = tmp_path / "p.strp"
    path.write_bytes(_mutate(GOOD_PROFILE, cuts)[:length])
    try:
        p = read_profile(path, 6, 32)
    except ProfileError:
        return
    assert all(0 <= il < 6 and 0 <= e < 32 for il, e in p.ranked)


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
