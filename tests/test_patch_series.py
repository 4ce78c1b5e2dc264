"""patches/: a git format-patch series, one topic a patch with a subject and a reason, that git am applies to the
pinned base; the --dev / --export round trip that leaves it byte for byte as it was; and its footprint in
llama.cpp's own files: new code lives in new files behind small hooks, so the diffs of upstream files stay few
lines and rebase easily."""
from __future__ import annotations

import filecmp
import shutil
import subprocess
from pathlib import Path

import pytest

from llama_moe import paths
from llama_moe.native_build.patches import IDENT, PatchSeries, apply_series, export_dev_tree, make_dev_tree
from llama_moe.native_build.source import BasePin, pristine_tree

# the lines the diffs add to upstream files, all patches together; lower it when a hook shrinks
MAX_UPSTREAM_ADDED = 389


def upstream_added_lines(series: PatchSeries) -> dict[str, int]:
    """The lines each upstream file gains, summed over the series' diffs (a file's ``+`` lines, not its header);
    the new files the patches add are not upstream's and do not count, in the patch that adds them or later."""
    added: dict[str, int] = {}
    ours: set[str] = set()
    for name in series.names:
        path, new = None, False
        for line in (series.root / name).read_text().splitlines():
            if line.startswith("diff --git "):
                path, new = None, False
            elif line.startswith("--- "):
                new = line == "--- /dev/null"
            elif line.startswith("+++ "):
                path = line[4:].removeprefix("b/")
                if new:
                    ours.add(path)
            elif line.startswith("+") and path is not None and path not in ours:
                added[path] = added.get(path, 0) + 1
    return added


def test_the_diffs_add_few_lines_to_upstream_files() -> None:
    added = upstream_added_lines(PatchSeries(paths.patches_dir()))
    total = sum(added.values())
    by_file = ", ".join(f"{p}: {n}" for p, n in sorted(added.items(), key=lambda kv: -kv[1])[:8])
    assert total <= MAX_UPSTREAM_ADDED, f"the series adds {total} lines to upstream files (most: {by_file})"


def test_the_count_reads_a_diffs_added_lines_only(tmp_path) -> None:
    (tmp_path / "BASE").write_text("commit: x\n")
    (tmp_path / "0001-a.patch").write_text(
        "diff --git a/src/a.c b/src/a.c\n--- a/src/a.c\n+++ b/src/a.c\n@@ -1,2 +1,3 @@\n int a;\n-int b;\n+int c;\n+int d;\n"
        "diff --git a/src/n.c b/src/n.c\nnew file mode 100644\n--- /dev/null\n+++ b/src/n.c\n@@ -0,0 +1,2 @@\n+int e;\n+int f;\n")
    (tmp_path / "0002-b.patch").write_text(  # a later change to a file of the series' own: not upstream's either
        "diff --git a/src/n.c b/src/n.c\n--- a/src/n.c\n+++ b/src/n.c\n@@ -1,2 +1,3 @@\n int e;\n+int g;\n int f;\n"
        "diff --git a/src/a.c b/src/a.c\n--- a/src/a.c\n+++ b/src/a.c\n@@ -1,3 +1,4 @@\n int a;\n+int h;\n int c;\n int d;\n")
    (tmp_path / "series").write_text("0001-a.patch\n0002-b.patch\n")
    assert upstream_added_lines(PatchSeries(tmp_path)) == {"src/a.c": 3}


@pytest.fixture(scope="module")
def pristine() -> Path:
    pin = BasePin.read(paths.patches_dir() / "BASE")
    try:
        return pristine_tree(pin, paths.cache_dir(), None)
    except Exception as e:  # noqa: BLE001 - the tree comes from the build's source; without it there is nothing to apply to
        pytest.fail(f"the pinned base is not available: {e}")


def test_every_patch_is_a_mail_with_a_subject_and_a_reason() -> None:
    series = PatchSeries(paths.patches_dir())
    readme = (series.root / "README.md").read_text()
    for name in series.names:
        text = (series.root / name).read_text()
        assert text.startswith("From 0000000000000000000000000000000000000000 "), name
        head, _, rest = text.partition("\n---\n")
        subject = next(line for line in head.splitlines() if line.startswith("Subject: "))
        assert subject.startswith("Subject: [PATCH] ") and len(subject) > 30, (name, subject)
        body = head.split("\n\n", 1)[1].strip()
        assert len(body.split()) >= 15, f"{name}: the reason is missing or too short"
        assert "diff --git" in rest, name
        assert name in readme, f"patches/README.md has no line for {name}"
    assert not (series.root / "files").exists(), "new files belong in the patch that adds them"


def test_the_series_applies_with_git_am_to_the_base(tmp_path: Path, pristine: Path) -> None:
    tree = tmp_path / "am"
    shutil.copytree(pristine, tree, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    git = lambda *a: subprocess.run(["git", *IDENT, *a], cwd=tree, check=True, capture_output=True, text=True)  # noqa: E731
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "base")
    series = PatchSeries(paths.patches_dir())
    git("am", "-q", *[str(series.root / n) for n in series.names])
    assert len(git("log", "--format=%s").stdout.splitlines()) == len(series.names) + 1
    applied = tmp_path / "applied"
    shutil.copytree(pristine, applied, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    apply_series(series, applied)
    for rel in git("diff", "--name-only", "HEAD~" + str(len(series.names)), "HEAD").stdout.split():
        assert filecmp.cmp(tree / rel, applied / rel, shallow=False), rel


def test_dev_and_export_leave_the_series_as_it_was(tmp_path: Path, pristine: Path) -> None:
    copy = tmp_path / "patches"
    shutil.copytree(paths.patches_dir(), copy)
    series = PatchSeries(copy)
    make_dev_tree(series, pristine, tmp_path / "dev")
    names = export_dev_tree(series, tmp_path / "dev")
    assert names == PatchSeries(paths.patches_dir()).names
    for name in names:
        assert (copy / name).read_bytes() == (paths.patches_dir() / name).read_bytes(), name
