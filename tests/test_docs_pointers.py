"""Every file, folder and module the documentation and the code point a reader to exists: the repository's paths
(``tests/...``, ``llama_moe/...``, ``docs/...``, ``benchmarks/...``, in backticks or in plain text) in the working
tree, or at the commit named beside them ("at commit 6521c6b"); the series' own llama.cpp sources
(``src/llama-moe-cache.cpp``, ``ggml/include/ggml-mailbox.h``) in a patch of ``patches/`` (``+++ b/<path>``); and
the modules and names written ``llama_moe.a.b`` in backticks in the package; and a document named alone
(``tools.md``) in some folder of the repository. Paths a command makes
(``~/.cache/...``, ``$OUT/...``, ``/tmp/...``), llama.cpp's own files (``tools/server/...``) and other
repositories' files (``owner/repo, docs/findings``) are not the repository's and are not checked."""
from __future__ import annotations

import ast
import io
import re
import tokenize
import subprocess
from functools import lru_cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# what is scanned: the README, the docs, the benchmarks' write-ups, CI, and the package's code and pages
SCANNED = ("README.md", "docs/**/*.md", "benchmarks/*.md", "benchmarks/cuda/*.md", ".ci/**/*", "llama_moe/**/*.py",
           "llama_moe/**/*.md", "llama_moe/**/*.html")
# the repository's top-level folders: a path that starts with one of them is the repository's
TOP = ("tests", "llama_moe", "docs", "benchmarks", "examples", "patches", ".ci")
# llama.cpp's tree: a path there whose file is one of the series' own (llama-moe-*, moe-*, ggml-mailbox*) comes from
# a patch
LLAMA_TREE = ("src", "include", "common", "ggml", "tools")
SERIES_FILE = re.compile(r"^(llama-moe|moe-|ggml-mailbox)")

_NOT_BEFORE = r"(?<![\w./~$@%:-])"  # not inside a longer path, a URL, ~/..., $OUT/..., a module's dotted name
REPO_PATH = re.compile(_NOT_BEFORE + r"((?:%s)/[\w.{},*/-]*)" % "|".join(re.escape(t) for t in TOP))
TREE_PATH = re.compile(_NOT_BEFORE + r"((?:%s)/[\w.{},/-]*)" % "|".join(LLAMA_TREE))
# another repository's file: "owner/repo, docs/findings" or "owner/repo docs/LOCALITY.md" (the owner not ours)
OTHER_REPO = re.compile(r"(?<![\w./-])([\w.-]+)/[\w.-]+,?\s+$")
AT_COMMIT = re.compile(r"^`*\s*\(?at commit ([0-9a-f]{7,40})\b")
TICKS = re.compile(r"``?([^`\n]+?)``?")
DOTTED = re.compile(r"^llama_moe(?:\.[A-Za-z_]\w*)+")
BARE_MD = re.compile(r"(?<![\w./-])([\w-]+\.md)\b")


def scanned_files() -> list[Path]:
    found: set[Path] = set()
    for pattern in SCANNED:
        found.update(p for p in ROOT.glob(pattern) if p.is_file() and "__pycache__" not in p.parts)
    return sorted(found)


@lru_cache(maxsize=None)
def patched_files() -> frozenset[str]:
    """The llama.cpp files the series adds or changes (``+++ b/<path>`` in a patch)."""
    out: set[str] = set()
    for patch in (ROOT / "patches").glob("*.patch"):
        out.update(re.findall(r"^\+\+\+ b/(\S+)", patch.read_text(errors="replace"), flags=re.M))
    return frozenset(out)


def _expand(path: str) -> list[str]:
    """``src/llama-moe-policy.{h,cpp}`` as both files."""
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [x for alt in m.group(1).split(",") for x in _expand(path[:m.start()] + alt + path[m.end():])]


def _clean(path: str) -> str | None:
    """The path as written, less the sentence around it; None for a placeholder (``...``, ``<build>``, ``X``)."""
    path = path.rstrip(".,;:")
    if "..." in path or not path.strip("/"):
        return None
    return path


@lru_cache(maxsize=None)
def _at_commit(commit: str, path: str) -> bool:
    proc = subprocess.run(["git", "-C", str(ROOT), "cat-file", "-e", f"{commit}:{path.rstrip('/')}"],
                          capture_output=True)
    return proc.returncode == 0


def _exists(path: str) -> bool:
    if "*" in path:
        return any(ROOT.glob(path))
    return (ROOT / path).is_dir() if path.endswith("/") else (ROOT / path).exists()


def stale_paths(text: str) -> list[str]:
    """The repository paths and the series' llama.cpp files ``text`` names that do not exist (each with why)."""
    bad = []
    for m in REPO_PATH.finditer(text):
        path = _clean(m.group(1))
        if path is None:
            continue
        other = OTHER_REPO.search(text[max(0, m.start() - 80):m.start()])
        if other and other.group(1) not in TOP:
            continue  # another repository's file
        commit = AT_COMMIT.match(text[m.end():m.end() + 40])
        for p in _expand(path):
            if commit:
                if not _at_commit(commit.group(1), p):
                    bad.append(f"{p} (not at commit {commit.group(1)})")
            elif not _exists(p):
                bad.append(p)
    for m in TREE_PATH.finditer(text):
        path = _clean(m.group(1))
        if path is None:
            continue
        for p in _expand(path):
            if SERIES_FILE.match(p.rsplit("/", 1)[-1]) and p not in patched_files():
                bad.append(f"{p} (the series adds no such file: no patch has +++ b/{p})")
    return bad


@lru_cache(maxsize=None)
def _module_names(source: Path) -> frozenset[str]:
    """The names a module defines or imports at its top level (and in its __all__)."""
    tree = ast.parse(source.read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


@lru_cache(maxsize=None)
def logger_names() -> frozenset[str]:
    """The package's loggers (``logging.getLogger("llama_moe.native")``): dotted names, not modules."""
    return frozenset(name for p in (ROOT / "llama_moe").rglob("*.py")
                     for name in re.findall(r"getLogger\(\s*[\"']([\w.]+)[\"']", p.read_text()))


def stale_modules(text: str) -> list[str]:
    """The ``llama_moe.a.b`` names in backticks that are neither a module of the package, a name one defines, nor
    one of its loggers."""
    bad = []
    for m in TICKS.finditer(text):
        d = DOTTED.match(m.group(1))
        if not d or d.group(0) in logger_names():
            continue
        parts = d.group(0).split(".")
        for i in range(len(parts), 0, -1):
            base = ROOT.joinpath(*parts[:i])
            source = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
            if source.is_file():
                rest = parts[i:]
                if rest and rest[0] not in _module_names(source) and not (base / rest[0]).is_dir():
                    bad.append(f"{d.group(0)} ({'.'.join(parts[:i])} has no {rest[0]})")
                break
    return bad


@lru_cache(maxsize=None)
def markdown_names() -> frozenset[str]:
    return frozenset(p.name for p in ROOT.rglob("*.md") if not ({".venv", ".git", "node_modules"} & set(p.parts)))


def _prose(path: Path, text: str) -> str:
    """What a reader reads: a Python file's comments and strings (not ``args.md``, an attribute), else all of it."""
    if path.suffix != ".py":
        return text
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    return "\n".join(t.string for t in tokens if t.type in (tokenize.COMMENT, tokenize.STRING))


def stale_documents(text: str) -> list[str]:
    """Documents named alone (``reference.md``, no folder) that no folder of the repository holds."""
    return [m.group(1) for m in BARE_MD.finditer(text) if m.group(1) not in markdown_names()]


def test_the_checks_find_what_is_stale_and_leave_what_is_not() -> None:
    stale = ("see tests/test_cli_errors.py; `docs/nope.md` and ``benchmarks/gone.py``, `src/llama-moe-nope.cpp`, "
             "tests/gpu/h200_serve.sh, `tests/gpu/h200_serve.sh (at commit 0000000)`")
    assert stale_paths(stale) == ["tests/test_cli_errors.py", "docs/nope.md", "benchmarks/gone.py",
                                  "tests/gpu/h200_serve.sh", "tests/gpu/h200_serve.sh (not at commit 0000000)",
                                  "src/llama-moe-nope.cpp (the series adds no such file: no patch has "
                                  "+++ b/src/llama-moe-nope.cpp)"]
    fine = ("`tests/cli/test_cli_errors.py`, docs/tools.md's, `llama_moe/tools/routing/`, `tests/...py`, `docs/*.md`, "
            "`src/llama-moe-policy.{h,cpp}`, `~/.cache/llama_moe/models/x.gguf`, `$OUT/benchmarks/x.json`, `/tmp/docs/x`, "
            "`tools/server/server.cpp`, `src/models/ARCH.cpp`, https://example.org/docs/nope.md, "
            "gajsanders/moe-trace, docs/findings 004-007, owner/repo docs/LOCALITY.md")
    assert stale_paths(fine) == []
    assert stale_modules("``llama_moe._loader``, `llama_moe.tools.routing.budget.nope(x)`") == [
        "llama_moe._loader (llama_moe has no _loader)", "llama_moe.tools.routing.budget.nope (llama_moe.tools.routing.budget has no nope)"]
    assert stale_documents("(reference.md, \"The adaptive cache\"); docs/tools.md, README.md") == ["reference.md"]
    assert stale_documents(_prose(Path("x.py"), "# see reference.md\nx = args.md\n")) == ["reference.md"]
    assert stale_documents(_prose(Path("x.py"), "x = args.md\n")) == []
    assert stale_modules("``llama_moe._native.loader``, `llama_moe.tools.routing.budget.engine_slots(layout)`, "
                         "`llama_moe.Model`, `llama_moe.tools.routing.policies`") == []


@pytest.mark.parametrize("path", scanned_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_pointer_exists(path: Path) -> None:
    text = path.read_text(errors="replace")
    bad = stale_paths(text) + stale_documents(_prose(path, text)) + (stale_modules(text) if path.suffix == ".py" else [])
    assert not bad, f"{path.relative_to(ROOT)} names what is not there: {', '.join(bad)}"
