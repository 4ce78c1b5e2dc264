"""The hybrid's convention in ggml, checked on the built library's CPU backend: a negative expert id in
MUL_MAT_ID selects nothing (a zero row), every other row is bit-identical, and two complementary halves of a
selection sum to the whole (tests/native/mmid_skip.cpp); and gpt-oss's vectorized activation against its formula
(tests/native/swiglu_oai.cpp). Each driver is compiled against the patched tree."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from llama_moe import paths
from llama_moe._native.loader import library_path

ROOT = Path(__file__).resolve().parents[2]


def _patched_tree(lib: Path) -> Path | None:
    manifest = lib.parent / "manifest.json"
    variant = json.loads(manifest.read_text()).get("variant", "cpu") if manifest.is_file() else "cpu"
    for root in (paths.cache_dir(), lib.parent.parent):
        tree = root / "work" / variant / "llama.cpp"
        if (tree / "ggml" / "include" / "ggml-cpu.h").is_file():
            return tree
    return None


def _run_native(name: str, tmp_path: Path) -> str:
    """Compiles tests/native/NAME.cpp against the built library's ggml and runs it; its stdout (exit 0 asserted)."""
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no C++ compiler")
    path = library_path()
    tree = _patched_tree(path)
    assert tree is not None, f"no patched llama.cpp tree next to {path}: build it with build_native.py"
    libdir = path.parent
    exe = tmp_path / name
    subprocess.run([cxx, "-O1", "-g", "-I", str(tree / "ggml" / "include"), str(ROOT / "tests" / "native" / f"{name}.cpp"),
                    "-o", str(exe), f"-L{libdir}", "-lggml-cpu", "-lggml-base", f"-Wl,-rpath,{libdir}"],
                   check=True, capture_output=True)
    proc = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    return proc.stdout


def test_negative_expert_ids_select_nothing_on_the_cpu(lib, tmp_path) -> None:
    assert "7 cases, 0 wrong values" in _run_native("mmid_skip", tmp_path)


def test_gpt_oss_activation_matches_its_formula_on_the_cpu(lib, tmp_path) -> None:
    """The series vectorizes SWIGLU_OAI (gpt-oss's activation, a third of the mailbox's CPU part on that shape);
    tests/native/swiglu_oai.cpp checks it against the scalar formula it replaces."""
    assert "20 cases, 0 wrong values" in _run_native("swiglu_oai", tmp_path)
