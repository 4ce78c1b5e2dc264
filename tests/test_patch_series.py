"""The patch series' footprint in llama.cpp's own files: new code lives in new files (patches/files/) behind small
hooks, so that the diffs of upstream files stay few lines and rebase easily."""
from __future__ import annotations

from llama_moe import paths
from llama_moe.native_build.patches import PatchSeries

# the lines the diffs add to upstream files, all patches together; lower it when a hook shrinks
MAX_UPSTREAM_ADDED = 420


def upstream_added_lines(series: PatchSeries) -> dict[str, int]:
    """The lines each upstream file gains, summed over the series' diffs (a file's ``+`` lines, not its header)."""
    added: dict[str, int] = {}
    for name in series.names:
        path = None
        for line in (series.root / name).read_text().splitlines():
            if line.startswith("+++ "):
                path = line[4:].removeprefix("b/")
            elif line.startswith("+") and path is not None:
                added[path] = added.get(path, 0) + 1
    return added


def test_the_diffs_touch_only_upstream_files_and_add_few_lines() -> None:
    series = PatchSeries(paths.patches_dir())
    added = upstream_added_lines(series)
    new_files = {p.as_posix() for p in series.new_files()}
    assert not new_files & added.keys(), "a new file is copied whole from patches/files/, never patched"
    total = sum(added.values())
    by_file = ", ".join(f"{p}: {n}" for p, n in sorted(added.items(), key=lambda kv: -kv[1])[:8])
    assert total <= MAX_UPSTREAM_ADDED, f"the series adds {total} lines to upstream files (most: {by_file})"


def test_the_count_reads_a_diffs_added_lines_only(tmp_path) -> None:
    (tmp_path / "BASE").write_text("commit: x\n")
    (tmp_path / "0001-a.patch").write_text(
        "diff --git a/src/a.c b/src/a.c\n--- a/src/a.c\n+++ b/src/a.c\n@@ -1,2 +1,3 @@\n int a;\n-int b;\n+int c;\n+int d;\n")
    (tmp_path / "series").write_text("0001-a.patch\n")
    assert upstream_added_lines(PatchSeries(tmp_path)) == {"src/a.c": 2}
