"""The package's layers, read from its sources (ast, nothing imported): the binding (every module of llama_moe
outside llama_moe/tools/, bar the entry point __main__) never imports llama_moe.tools, so it cannot reach it
through another module either; inside the binding, context never reaches chat, batch or session (they build on it), and the loader
never reaches native_build (it reads the build's manifest); formats/ imports only errors; nothing imports
tools/cli/ but the entry points; argparse lives in tools/cli/ alone, so no library function can take its
Namespace; no module is named after a third-party package the package imports. The checker is also run on a
small tree of its own with one violation of each rule, so that a checker that finds nothing cannot pass; and a
fresh interpreter that imports every binding module is checked to have loaded no tool module."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "llama_moe"

TOOLS = "llama_moe.tools"
ENTRY_POINTS = ("llama_moe.__main__",)
CLI = "llama_moe.tools.cli"
# Inside the binding: what a module must not reach, with the reason the message gives.
NEVER_REACHES = (
    ("llama_moe.context", ("llama_moe.chat", "llama_moe.batch", "llama_moe.session"), "they build on Context"),
    ("llama_moe._native.loader", ("llama_moe.native_build",), "the loader reads the build's manifest"),
)
# Known exceptions, each with its reason; any other import that breaks a rule fails.
ALLOWED = {
    ("llama_moe.__main__", "llama_moe.tools.cli"),  # python -m llama_moe runs the command line
}
ARGPARSE_ALLOWED: set[str] = set()


def _module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules(root: Path) -> dict[str, Path]:
    return {_module_name(root, p): p for p in sorted(root.rglob("*.py")) if "__pycache__" not in p.parts}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every module ``name`` imports, at the top or inside a function, relative imports resolved; for
    ``from P import x`` the submodule P.x when there is one."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            subs = {f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in known}
            out.update(subs or {mod})
    return out


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _paths(graph: dict[str, set[str]], start: str, allowed: set[tuple[str, str]]) -> dict[str, list[str]]:
    """Every module ``start`` reaches, each with one chain of imports that leads to it."""
    via = {start: [start]}
    todo = [start]
    while todo:
        cur = todo.pop()
        for m in sorted(graph.get(cur, ())):
            if (cur, m) not in allowed and m not in via:
                via[m] = via[cur] + [m]
                todo.append(m)
    return via


def binding_modules(found: dict[str, Path], pkg: str = "llama_moe") -> list[str]:
    tools, entry = TOOLS.replace("llama_moe", pkg, 1), tuple(e.replace("llama_moe", pkg, 1) for e in ENTRY_POINTS)
    return [n for n in found if not _within(n, (tools,)) and n not in entry]


def violations(root: Path) -> list[str]:
    found = modules(root)
    pkg = root.name

    def ours(name: str) -> str:
        return name.replace("llama_moe", pkg, 1)

    graph = {name: {m for m in imports(name, path, set(found)) if _within(m, (pkg,))} for name, path in found.items()}
    raw = {name: imports(name, path, set(found)) for name, path in found.items()}
    allowed = {(ours(a), ours(b)) for a, b in ALLOWED}
    tools, cli = ours(TOOLS), ours(CLI)
    out = []
    # 1. no binding module imports a tool module; as every module outside tools/ is the binding's, nothing the
    # binding imports can reach the tools in turn
    for name in binding_modules(found, pkg):
        for m in sorted(graph[name]):
            if _within(m, (tools,)) and (name, m) not in allowed:
                out.append(f"{name} imports {m}: the binding never imports the tools")
    # 2. inside the binding, the lower module never reaches the higher ones
    for start, targets, why in NEVER_REACHES:
        for name in (n for n in found if _within(n, (ours(start),))):
            for m, chain in _paths(graph, name, allowed).items():
                if _within(m, tuple(ours(t) for t in targets)) and not _within(chain[-2], tuple(ours(t) for t in targets)):
                    out.append(f"{name} reaches {m} ({why}): {' -> '.join(chain)}")
    # 3. formats/ imports only errors (and itself)
    for name in (n for n in found if _within(n, (f"{pkg}.formats",))):
        for m in sorted(graph[name]):
            if not _within(m, (f"{pkg}.errors", f"{pkg}.formats")):
                out.append(f"{name} imports {m}: formats/ imports only {pkg}.errors")
    # 4. nothing imports the command line but itself and the entry points
    for name, deps in graph.items():
        if _within(name, (cli,)):
            continue
        for m in sorted(deps):
            if _within(m, (cli,)) and (name, m) not in allowed:
                out.append(f"{name} imports {m}: only the entry points import the command line")
    # 5. argparse in the command line alone
    for name, deps in raw.items():
        if "argparse" in deps and not _within(name, (cli,)) and name.replace(pkg, "llama_moe", 1) not in ARGPARSE_ALLOWED:
            out.append(f"{name} imports argparse: option parsing belongs to {cli}")
    # 6. no module named after a third-party package the package imports (llama_moe/gguf once hid gguf-py)
    third_party = {m.split(".")[0] for deps in raw.values() for m in deps
                   if m and not _within(m, (pkg,)) and m.split(".")[0] not in sys.stdlib_module_names}
    for name in found:
        if name.rpartition(".")[2] in third_party:
            out.append(f"{name} has the name of the package {name.rpartition('.')[2]}, which {pkg} imports")
    return sorted(set(out))


def test_the_package_keeps_its_import_rules() -> None:
    assert violations(PACKAGE) == []


def test_the_binding_loads_no_tool_module() -> None:
    """What the sources say, checked on a real interpreter: importing every binding module loads no tool module."""
    names = binding_modules(modules(PACKAGE))
    code = (f"import importlib, json, sys\nfor n in {names!r}:\n    importlib.import_module(n)\n"
            f"print(json.dumps(sorted(m for m in sys.modules if m == {TOOLS!r} or m.startswith({TOOLS + '.'!r}))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PACKAGE.parent, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert len(names) > 20 and "llama_moe.context" in names and "llama_moe.native_build" in names
    assert json.loads(proc.stdout) == []


def test_the_checker_finds_a_violation_of_each_rule(tmp_path: Path) -> None:
    root = tmp_path / "llama_moe"
    files = {
        "__init__.py": "",
        "errors.py": "",
        "middle.py": "from .tools.routing import plan\nfrom . import chat\n",  # the binding imports a tool
        "model.py": "def f():\n    from .tools.bench.run import x\n",   # a lazy import counts as well
        "context.py": "from . import middle\n",                        # and so context reaches chat
        "chat.py": "from .context import Context\n",
        "numpy.py": "",                                                 # the name of a package it imports
        "_native/__init__.py": "", "_native/loader.py": "from ..native_build import patches\nimport numpy\n",
        "native_build/__init__.py": "", "native_build/patches.py": "",
        "formats/__init__.py": "", "formats/trace.py": "from ..errors import E\nfrom .. import middle\n",
        "tools/__init__.py": "",
        "tools/routing/__init__.py": "", "tools/routing/plan.py": "from ...context import Context\n",
        "tools/bench/__init__.py": "", "tools/bench/run.py": "import argparse\n",   # argparse outside the cli
        "tools/server/__init__.py": "from ..cli import main\n",                      # a library module importing it
        "tools/cli/__init__.py": "import argparse\nfrom ..routing import plan\n",
        "__main__.py": "from .tools.cli import main\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    found = violations(root)
    assert found == [
        "llama_moe._native.loader reaches llama_moe.native_build.patches (the loader reads the build's manifest): "
        "llama_moe._native.loader -> llama_moe.native_build.patches",
        "llama_moe.context reaches llama_moe.chat (they build on Context): llama_moe.context -> llama_moe.middle -> llama_moe.chat",
        "llama_moe.formats.trace imports llama_moe.middle: formats/ imports only llama_moe.errors",
        "llama_moe.middle imports llama_moe.tools.routing.plan: the binding never imports the tools",
        "llama_moe.model imports llama_moe.tools.bench.run: the binding never imports the tools",
        "llama_moe.numpy has the name of the package numpy, which llama_moe imports",
        "llama_moe.tools.bench.run imports argparse: option parsing belongs to llama_moe.tools.cli",
        "llama_moe.tools.server imports llama_moe.tools.cli: only the entry points import the command line",
    ], found
