"""The examples run as a user would run them, on the embedded default model, the cache in RAM (--cache-device CPU)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, *args: str) -> str:
    # the package of this checkout, as the tests import it (not whichever one is installed)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path}
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / script), *args, "--cache-device", "CPU"],
                          capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def test_generate_streams_text_and_reports_the_cache(lib) -> None:
    out = _run("generate.py", "--cache-mib", "2", "-n", "32")
    assert re.search(r"\d+ tokens at [\d.]+ tok/s", out)
    assert re.search(r"MoE cache: hit rate 0\.\d{3}, \d+ experts uploaded", out)


def test_the_chunked_decoder_rebalances_between_chunks(lib) -> None:
    out = _run("chunked_adaptive.py", "--chunks", "4", "--chunk", "32")
    rates = [float(r) for r in re.findall(r"hit rate (0\.\d{3})", out)]
    assert len(rates) == 4
    assert re.search(r"\d+ experts swapped in after it", out)


def test_chat_streams_two_turns_and_keeps_the_first(lib) -> None:
    out = _run("chat.py", "--cache-mib", "2", "-n", "24")
    assert out.count("assistant: ") == 2
    kept = [int(k) for k in re.findall(r"(\d+) of \d+ prompt tokens kept", out)]
    assert kept[0] == 0 and kept[1] > 0
    assert re.search(r"MoE cache: hit rate 0\.\d{3}", out)


def test_batch_generates_four_prompts_together(lib) -> None:
    out = _run("batch.py", "--cache-mib", "2", "-n", "24")
    assert len(re.findall(r"^\[\d\] ", out, re.M)) == 4
    assert re.search(r"4 sequences: \d+ tokens decoded in \d+ steps at [\d.]+ tok/s together", out)


def test_a_session_resumes_warm(lib) -> None:
    out = _run("sessions.py", "--cache-mib", "2", "-n", "24")
    assert re.search(r"saved \d+ tokens, \d+ bytes of state and [1-9]\d* experts", out)
    assert re.search(r"resumed with [1-9]\d* experts brought back", out)
    assert re.search(r"hit rate after the resume 0\.\d{3}", out)
