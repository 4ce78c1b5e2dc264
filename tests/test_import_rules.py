"""The package's layers, read from its sources (ast, nothing imported): the binding (params, model, context,
stats, _native/) never reaches routing/, bench/, server/ or cli/, not even through another module; formats/
imports only errors; nothing imports cli/ but the entry points; argparse lives in cli/ alone, so no library
function can take its Namespace. The checker is also run on a small tree of its own with one violation of
each rule, so that a checker that finds nothing cannot pass."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "llama_moe"

BINDING = ("llama_moe.params", "llama_moe.model", "llama_moe.context", "llama_moe.stats", "llama_moe._native",
           "llama_moe.chat", "llama_moe.batch", "llama_moe.session", "llama_moe.result_stream")
TOOLS = ("llama_moe.routing", "llama_moe.bench", "llama_moe.server", "llama_moe.cli")
# Known exceptions, each with its reason; any other import that breaks a rule fails.
ALLOWED = {
    ("llama_moe.__main__", "llama_moe.cli"),
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


def violations(root: Path) -> list[str]:
    found = modules(root)
    pkg = root.name
    graph = {name: {m for m in imports(name, path, set(found)) if _within(m, (pkg,))} for name, path in found.items()}
    raw = {name: imports(name, path, set(found)) for name, path in found.items()}
    binding = tuple(b.replace("llama_moe", pkg, 1) for b in BINDING)
    tools = tuple(t.replace("llama_moe", pkg, 1) for t in TOOLS)
    allowed = {(a.replace("llama_moe", pkg, 1), b.replace("llama_moe", pkg, 1)) for a, b in ALLOWED}
    out = []
    # 1. the binding, and all it imports in turn, never reaches the tools
    for start in (n for n in found if _within(n, binding)):
        seen, todo, via = {start}, [start], {start: [start]}
        while todo:
            cur = todo.pop()
            for m in sorted(graph[cur]):
                if (cur, m) in allowed or m in seen:
                    continue
                seen.add(m)
                via[m] = via[cur] + [m]
                if _within(m, tools):
                    out.append(f"the binding reaches {m}: {' -> '.join(via[m])}")
                else:
                    todo.append(m)
    # 2. formats/ imports only errors (and itself)
    for name in (n for n in found if _within(n, (f"{pkg}.formats",))):
        for m in sorted(graph[name]):
            if not _within(m, (f"{pkg}.errors", f"{pkg}.formats")):
                out.append(f"{name} imports {m}: formats/ imports only {pkg}.errors")
    # 3. nothing imports cli/ but cli/ itself and the entry points
    for name, deps in graph.items():
        if _within(name, (f"{pkg}.cli",)):
            continue
        for m in sorted(deps):
            if _within(m, (f"{pkg}.cli",)) and (name, m) not in allowed:
                out.append(f"{name} imports {m}: only the entry points import the command line")
    # 4. argparse in cli/ alone
    for name, deps in raw.items():
        if "argparse" in deps and not _within(name, (f"{pkg}.cli",)) and name.replace(pkg, "llama_moe", 1) not in ARGPARSE_ALLOWED:
            out.append(f"{name} imports argparse: option parsing belongs to {pkg}.cli")
    return sorted(set(out))


def test_the_package_keeps_its_import_rules() -> None:
    assert violations(PACKAGE) == []


def test_the_checker_finds_a_violation_of_each_rule(tmp_path: Path) -> None:
    root = tmp_path / "llama_moe"
    files = {
        "__init__.py": "",
        "errors.py": "",
        "middle.py": "from .routing import plan\n",                      # the binding reaches routing through it
        "context.py": "from . import middle\n",
        "model.py": "def f():\n    from .bench.run import x\n",        # a lazy import counts as well
        "_native/__init__.py": "",
        "routing/__init__.py": "", "routing/plan.py": "", "routing/budget.py": "",
        "bench/__init__.py": "", "bench/run.py": "import argparse\n",   # argparse outside cli/
        "formats/__init__.py": "", "formats/trace.py": "from ..errors import E\nfrom .. import middle\n",
        "server/__init__.py": "from ..cli import main\n",               # a library module importing cli/
        "cli/__init__.py": "import argparse\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    found = violations(root)
    assert found == [
        "llama_moe.bench.run imports argparse: option parsing belongs to llama_moe.cli",
        "llama_moe.formats.trace imports llama_moe.middle: formats/ imports only llama_moe.errors",
        "llama_moe.server imports llama_moe.cli: only the entry points import the command line",
        "the binding reaches llama_moe.bench.run: llama_moe.model -> llama_moe.bench.run",
        "the binding reaches llama_moe.routing.plan: llama_moe.context -> llama_moe.middle -> llama_moe.routing.plan",
    ], found
