"""The patched llama.cpp sources, for tests that compile one of our files on their own (a fuzzer's harness)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from llama_moe import paths
from llama_moe.native_build.patches import PatchSeries, apply_series
from llama_moe.native_build.source import BasePin


def patched_tree(dest: Path) -> Path:
    """The pinned base's source folders with the series applied, at dest; skips without the cached base (it is
    cached by a build from the sdist)."""
    pin = BasePin.read(paths.patches_dir() / "BASE")
    pristine = paths.cache_dir() / "src" / f"pristine-{pin.commit}"
    if not pristine.is_dir():
        pytest.skip("the pristine tree is only cached after a build from the sdist")
    dest.mkdir(parents=True)
    for part in ("include", "src", "common", "ggml", "tools"):
        shutil.copytree(pristine / part, dest / part, symlinks=True)
    apply_series(PatchSeries(paths.patches_dir()), dest)
    return dest
