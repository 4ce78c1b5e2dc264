"""build_native.py: the patch series, its failures, the no-op rebuild, bundles and CUDA detection."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from llama_moe import paths
from llama_moe._native.ffi import ABI_VERSION
from llama_moe.native_build.patches import PatchSeries, apply_series
from llama_moe.native_build.source import BUNDLE_MARKER, BasePin, write_bundle
from llama_moe.errors import BuildError

ROOT = Path(__file__).resolve().parents[2]


def _run_build(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "build_native.py"), *args], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=600)


def _pristine() -> Path:
    pin = BasePin.read(paths.patches_dir() / "BASE")
    tree = paths.cache_dir() / "src" / f"pristine-{pin.commit}"
    if not tree.is_dir():
        pytest.skip("the pristine tree is only cached after a build from the sdist")
    return tree


def test_series_lists_existing_patches_and_the_hash_follows_the_content(tmp_path) -> None:
    series = PatchSeries(paths.patches_dir())
    assert series.names and all((series.root / n).is_file() for n in series.names)
    copy = tmp_path / "patches"
    subprocess.run(["cp", "-r", str(series.root), str(copy)], check=True)
    before = PatchSeries(copy).digest()
    assert before == series.digest()
    patch = copy / series.names[0]
    patch.write_text(patch.read_text() + "\n")
    assert PatchSeries(copy).digest() != before


def test_a_patch_that_does_not_apply_names_itself_and_its_hunk(tmp_path) -> None:
    tree = tmp_path / "tree"
    (tree / "src").mkdir(parents=True)
    (tree / "src" / "a.c").write_text("int a(void) {\n    return 1;\n}\n")
    patches = tmp_path / "patches"
    patches.mkdir()
    (patches / "BASE").write_text("commit: x\npackage: p\nmember: m\nsha256: s\n")
    (patches / "0001-change-a.patch").write_text(
        "--- a/src/a.c\n+++ b/src/a.c\n@@ -1,3 +1,3 @@\n int a(void) {\n-    return 2;\n+    return 3;\n }\n")
    (patches / "series").write_text("0001-change-a.patch\n")
    with pytest.raises(BuildError) as err:
        apply_series(PatchSeries(patches), tree)
    text = str(err.value)
    assert "0001-change-a.patch does not apply" in text
    assert "return 2" in text  # the rejected hunk is shown
    assert (tree / "src" / "a.c").read_text() == "int a(void) {\n    return 1;\n}\n"


def test_the_series_applies_to_the_pinned_base(tmp_path) -> None:
    pristine = _pristine()
    # inside a git repository of its own (a cache folder in a checkout): git must not look above the tree
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    tree = tmp_path / "llama.cpp"
    tree.mkdir()
    for part in ("include", "src", "common", "ggml", "tools"):
        subprocess.run(["cp", "-r", str(pristine / part), str(tree / part)], check=True)
    apply_series(PatchSeries(paths.patches_dir()), tree)
    assert '#include "llama-moe.h"' in (tree / "include" / "llama.h").read_text()
    assert "llama_moe_abi_version" in (tree / "include" / "llama-moe.h").read_text()
    assert (tree / "src" / "llama-moe.cpp").is_file()
    # the binding names the engine's states, modes and reasons from its declarations of these enums: they must be
    # the header's, value for value
    header = (tree / "include" / "llama-moe.h").read_text()
    from llama_moe._native.ffi import ffi

    for name in ("state", "reason", "choice", "mode"):
        body = re.search(rf"enum llama_moe_cache_{name} {{(.*?)}};", header, re.S).group(1)
        values = {k: eval(v, {}) for k, v in re.findall(r"^\s*(LLAMA_MOE_CACHE_\w+)\s*=\s*([^,]+),", body, re.M)}
        assert values and values == ffi.typeof(f"enum llama_moe_cache_{name}").relements, name


def test_a_file_synced_back_to_older_bytes_is_newer_than_before(tmp_path) -> None:
    from llama_moe.native_build import _sync_tree

    src, dest = tmp_path / "src", tmp_path / "dest"
    src.mkdir()
    (src / "a.c").write_text("int a;\n")
    os.utime(src / "a.c", (1_000_000_000, 1_000_000_000))  # the pristine tree's old mtime
    assert _sync_tree(src, dest) == 1
    os.utime(dest / "a.c", (1_500_000_000, 1_500_000_000))  # built since, from patched bytes
    (dest / "a.c").write_text("int b;\n")
    os.utime(dest / "a.c", (1_500_000_000, 1_500_000_000))
    assert _sync_tree(src, dest) == 1
    assert (dest / "a.c").read_text() == "int a;\n"
    assert (dest / "a.c").stat().st_mtime > 1_500_000_000  # ninja sees it changed and rebuilds its object


def test_a_second_build_with_nothing_changed_is_a_no_op() -> None:
    proc = _run_build("--cpu", "--tests")
    assert proc.returncode == 0, proc.stderr
    assert "up to date" in proc.stdout
    install = Path(proc.stdout.split("up to date: ", 1)[1].split(" (", 1)[0])
    manifest = json.loads((install / "manifest.json").read_text())
    assert manifest["variant"] == "cpu" and manifest["abi_version"] == ABI_VERSION
    assert manifest["patch_hash"] == PatchSeries(paths.patches_dir()).digest()
    for tool in ("libllama.so", "llama-server", "llama-cli", "llama-bench", "test-backend-ops"):
        assert (install / tool).exists(), tool
    recorded = json.loads(paths.library_manifest().read_text())["cpu"]  # where the loader finds the library
    assert recorded["library"] == str(install / "libllama.so") and recorded["patch_hash"] == manifest["patch_hash"]
    assert set(recorded["inputs"]) == {"BASE", "series", *PatchSeries(paths.patches_dir()).names} | {
        f"files/{p.as_posix()}" for p in PatchSeries(paths.patches_dir()).new_files()}


def test_the_loader_finds_the_build_by_its_manifest_and_refuses_it_for_other_patches(tmp_path) -> None:
    """A copy of the package and its patches: the build (up to date) records its library in the copy's manifest,
    the loader loads it without importing the build code, and once a patch changes it refuses the build, naming
    the patch."""
    import shutil

    shutil.copytree(ROOT / "llama_moe", tmp_path / "llama_moe", ignore=shutil.ignore_patterns("__pycache__", "library.json"))
    shutil.copytree(ROOT / "patches", tmp_path / "patches")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    env.pop("LLAMA_MOE_LIB", None)
    load = ("import sys, llama_moe; v = llama_moe.native_version(); "
            "print(v['path'], v['abi_version'], any(m.startswith('llama_moe.native_build') for m in sys.modules))")

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)

    proc = run("-c", load)
    assert proc.returncode != 0 and "the patched libllama was not found" in proc.stderr
    assert f"{tmp_path / 'llama_moe' / '_native' / 'library.json'}, which the build writes, does not exist" in proc.stderr
    proc = run("-m", "llama_moe", "build", "--cpu", "--tests")
    assert proc.returncode == 0 and "up to date" in proc.stdout, proc.stderr
    proc = run("-c", load)
    assert proc.returncode == 0, proc.stderr
    path, abi, build_code = proc.stdout.split()
    assert Path(path).name == "libllama.so" and int(abi) == ABI_VERSION and build_code == "False"
    last = PatchSeries(tmp_path / "patches").names[-1]
    with open(tmp_path / "patches" / last, "a") as f:
        f.write("\n")
    proc = run("-c", load)
    assert proc.returncode != 0
    assert f"{path}: built from other patches ({tmp_path / 'patches' / last} changed since)" in proc.stderr


def test_cuda_without_a_toolkit_fails_hard(tmp_path) -> None:
    proc = _run_build("--cuda", CUDA_HOME=str(tmp_path))
    assert proc.returncode == 1
    assert "cannot build for CUDA" in proc.stderr and f"CUDA_HOME={tmp_path} has no working bin/nvcc" in proc.stderr


def test_a_bad_source_is_refused(tmp_path) -> None:
    not_a_tree = tmp_path / "empty"
    not_a_tree.mkdir()
    proc = _run_build("--cpu", "--force", "--source", str(not_a_tree))
    assert proc.returncode == 1 and "not a llama.cpp source tree" in proc.stderr
    fake = tmp_path / "fake.tar.gz"
    with tarfile.open(fake, "w:gz") as tar:
        tar.add(not_a_tree, arcname="x")
    proc = _run_build("--cpu", "--force", "--source", str(fake))
    assert proc.returncode == 1 and "sha256 is" in proc.stderr


@pytest.mark.slow
def test_bundle_is_small_and_marked(tmp_path) -> None:
    pin = BasePin.read(paths.patches_dir() / "BASE")
    out = tmp_path / "llama.cpp-bundle.tar.xz"
    size = write_bundle(_pristine(), pin, out)
    assert size < 16 * 2**20
    with tarfile.open(out) as tar:
        names = set(tar.getnames())
        marker = json.load(tar.extractfile(f"llama.cpp/{BUNDLE_MARKER}"))
    assert marker["commit"] == pin.commit
    for needed in ("llama.cpp/include/llama.h", "llama.cpp/ggml/src/ggml-cuda/mmq.cu", "llama.cpp/tools/server/server.cpp",
                   "llama.cpp/scripts/ui-assets.cmake", "llama.cpp/tests/test-backend-ops.cpp"):
        assert needed in names, needed
