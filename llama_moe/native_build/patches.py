"""The patch series: hashing it, applying it to a tree, and the git round trip of --dev / --export."""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import BuildError

log = logging.getLogger(__name__)

FILES_DIR = "files"  # our new source files, laid out as in the llama.cpp tree


@dataclass(frozen=True)
class PatchSeries:
    """``patches/``: ``BASE``, ``series`` (one diff name a line, in order), the diffs, and ``files/``."""

    root: Path

    @property
    def names(self) -> list[str]:
        series = self.root / "series"
        if not series.is_file():
            raise BuildError(f"{series}: missing (the list of patches to apply, in order)")
        names = [line.strip() for line in series.read_text().splitlines()]
        return [n for n in names if n and not n.startswith("#")]

    def new_files(self) -> list[Path]:
        files = self.root / FILES_DIR
        return sorted(p.relative_to(files) for p in files.rglob("*") if p.is_file()) if files.is_dir() else []

    def inputs(self) -> list[str]:
        """The files ``digest`` reads, relative to the series' folder: BASE, series, the diffs, the new files."""
        return ["BASE", "series", *self.names, *(f"{FILES_DIR}/{rel.as_posix()}" for rel in self.new_files())]

    def digest(self) -> str:
        """A hash of everything that changes the patched tree: the series, every diff and every new file."""
        h = hashlib.sha256()
        h.update((self.root / "BASE").read_bytes())
        for name in self.names:
            path = self.root / name
            if not path.is_file():
                raise BuildError(f"patches/series names {name}, but {path} does not exist")
            h.update(name.encode() + b"\0" + path.read_bytes())
        for rel in self.new_files():
            h.update(rel.as_posix().encode() + b"\0" + (self.root / FILES_DIR / rel).read_bytes())
        return h.hexdigest()[:12]


def _git(args: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    if shutil.which("git") is None:
        raise BuildError("git is needed to apply the patches (git apply) and was not found on PATH")
    # Never let git find a repository above the tree: inside one (a cache folder in a checkout), git apply
    # takes paths from that repository's root and silently skips every file of ours.
    env = {**os.environ, "GIT_CEILING_DIRECTORIES": str(cwd.resolve().parent)}
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, env=env)
    if check and proc.returncode != 0:
        raise BuildError(f"git {' '.join(args)} failed in {cwd}:\n{proc.stderr.strip()}")
    return proc


def copy_new_files(series: PatchSeries, tree: Path) -> None:
    for rel in series.new_files():
        dest = tree / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(series.root / FILES_DIR / rel, dest)


def apply_patch(series: PatchSeries, name: str, tree: Path) -> None:
    """Applies one diff; on failure the error names the patch and shows the hunks that were rejected."""
    patch = (series.root / name).resolve()
    check = _git(["apply", "--check", "--whitespace=nowarn", str(patch)], tree, check=False)
    if check.returncode == 0:
        _git(["apply", "--whitespace=nowarn", str(patch)], tree)
        # an apply that skipped files still exits 0: check that the patch now reverses cleanly
        if _git(["apply", "--check", "--reverse", "--whitespace=nowarn", str(patch)], tree, check=False).returncode != 0:
            raise BuildError(f"patch {name} reported success but is not in the tree at {tree}")
        return
    # Apply what does apply with --reject, to show exactly which hunks do not.
    rejected = _git(["apply", "--reject", "--whitespace=nowarn", str(patch)], tree, check=False)
    rej_text = []
    for rej in sorted(tree.rglob("*.rej")):
        rej_text.append(f"--- {rej.relative_to(tree)}\n{rej.read_text(errors='replace')}")
    raise BuildError(
        f"patch {name} does not apply to llama.cpp at the pinned base:\n{check.stderr.strip()}\n"
        + ("\nrejected hunks:\n" + "\n".join(rej_text) if rej_text else rejected.stderr.strip()))


def apply_series(series: PatchSeries, tree: Path) -> None:
    copy_new_files(series, tree)
    for name in series.names:
        log.debug("applying %s", name)
        apply_patch(series, name, tree)


IDENT = ["-c", "user.name=llama_moe", "-c", "user.email=llama_moe@localhost"]


def is_mail(path: Path) -> bool:
    """A patch in ``git format-patch`` form (a mail with a subject and a reason), not a bare diff."""
    with open(path, "rb") as f:
        return f.read(5) == b"From "


def make_dev_tree(series: PatchSeries, pristine: Path, dest: Path) -> None:
    """A git tree for editing C++ in place: the base, then one commit per patch (``git am``: its subject and
    reason become the commit's message)."""
    if dest.exists():
        raise BuildError(f"{dest} exists; remove it or export from it first")
    shutil.copytree(pristine, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    _git(["init", "-q"], dest)
    _git(["add", "-A"], dest)
    _git([*IDENT, "commit", "-qm", "base: llama.cpp at patches/BASE"], dest)
    _git(["tag", "llama-moe-base"], dest)
    if series.new_files():  # new files kept whole beside bare diffs
        copy_new_files(series, dest)
        _git(["add", "-A"], dest)
        _git([*IDENT, "commit", "-qm", "files: llama_moe's new source files", "--allow-empty"], dest)
    for name in series.names:
        path = (series.root / name).resolve()
        if is_mail(path):
            _git([*IDENT, "am", "-q", "--keep-cr", "--committer-date-is-author-date", str(path)], dest)
            continue
        apply_patch(series, name, dest)
        _git(["add", "-A"], dest)
        _git([*IDENT, "commit", "-qm", name, "--allow-empty"], dest)


def export_dev_tree(series: PatchSeries, dev: Path) -> list[str]:
    """Writes ``patches/`` back from a dev tree: each commit after the base becomes one ``git format-patch``
    mail (its subject and reason, then the diff, new files included), named by its subject; ``series`` lists
    them in order."""
    subjects = _git(["log", "--reverse", "--format=%s", "llama-moe-base..HEAD"], dev).stdout.splitlines()
    if not subjects:
        raise BuildError(f"{dev}: no commits after the base")
    for subject in subjects:
        if subject.startswith("files:") or subject.strip().endswith(".patch"):
            raise BuildError(f"{dev}: commit '{subject}' has no subject of its own; give each commit a subject and a "
                             "reason (git rebase -i, reword) before exporting")
    out = Path(tempfile.mkdtemp(prefix="export.", dir=series.root.parent))
    try:
        _git(["format-patch", "-q", "--zero-commit", "--no-signature", "--no-numbered", "-o", str(out),
              "llama-moe-base..HEAD"], dev)
        names = sorted(p.name for p in out.iterdir())
        for old in series.names:
            (series.root / old).unlink(missing_ok=True)
        if (series.root / FILES_DIR).exists():
            shutil.rmtree(series.root / FILES_DIR)
        for name in names:
            shutil.move(str(out / name), series.root / name)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    (series.root / "series").write_text("".join(n + "\n" for n in names))
    return names
