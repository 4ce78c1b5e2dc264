"""The patch series: hashing it, applying it to a tree, and the git round trip of --dev / --export."""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
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


def make_dev_tree(series: PatchSeries, pristine: Path, dest: Path) -> None:
    """A git tree for editing C++ in place: the base, then our new files, then one commit per patch."""
    if dest.exists():
        raise BuildError(f"{dest} exists; remove it or export from it first")
    shutil.copytree(pristine, dest, symlinks=True, ignore=shutil.ignore_patterns(".git"))
    ident = ["-c", "user.name=llama_moe", "-c", "user.email=llama_moe@localhost"]
    _git(["init", "-q"], dest)
    _git(["add", "-A"], dest)
    _git([*ident, "commit", "-qm", "base: llama.cpp at patches/BASE"], dest)
    _git(["tag", "llama-moe-base"], dest)
    copy_new_files(series, dest)
    _git(["add", "-A"], dest)
    _git([*ident, "commit", "-qm", "files: llama_moe's new source files", "--allow-empty"], dest)
    for name in series.names:
        apply_patch(series, name, dest)
        _git(["add", "-A"], dest)
        _git([*ident, "commit", "-qm", name, "--allow-empty"], dest)


def export_dev_tree(series: PatchSeries, dev: Path) -> list[str]:
    """Writes ``patches/`` back from a dev tree: files new since the base go to files/, each commit after
    the 'files' commit becomes the diff named by its subject, restricted to files the base has."""
    base_files = set(_git(["ls-tree", "-r", "--name-only", "llama-moe-base"], dev).stdout.split())
    head_files = set(_git(["ls-tree", "-r", "--name-only", "HEAD"], dev).stdout.split())
    new = sorted(head_files - base_files)
    files_root = series.root / FILES_DIR
    if files_root.exists():
        shutil.rmtree(files_root)
    for rel in new:
        dest = files_root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(_git(["show", f"HEAD:{rel}"], dev).stdout.encode())
    log_lines = _git(["log", "--reverse", "--format=%H %s", "llama-moe-base..HEAD"], dev).stdout.splitlines()
    commits = [line.split(" ", 1) for line in log_lines]
    if not commits or not commits[0][1].startswith("files:"):
        raise BuildError(f"{dev}: the first commit after the base must be the 'files:' commit")
    names = []
    for sha, subject in commits[1:]:
        name = subject.strip()
        if not name.endswith(".patch"):
            raise BuildError(f"{dev}: commit {sha[:10]} '{subject}' is not named like a patch (NNNN-name.patch)")
        changed = _git(["diff-tree", "--no-commit-id", "--name-only", "-r", sha], dev).stdout.split()
        paths = [p for p in changed if p in base_files]
        diff = _git(["diff", "--no-color", "--no-ext-diff", f"{sha}~1", sha, "--", *paths], dev).stdout if paths else ""
        (series.root / name).write_text(diff)
        names.append(name)
    old = set(series.names) - set(names)
    for stale in old:
        (series.root / stale).unlink(missing_ok=True)
    (series.root / "series").write_text("".join(n + "\n" for n in names))
    return names
