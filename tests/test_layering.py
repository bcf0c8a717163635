"""The package's shape: no import cycle among fedray's files (imports inside functions count), nothing
imports upward out of fedray/core, no file over ~600 lines, no engine function over ~80 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "fedray"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PKG.rglob("*.py")}


def _resolve(name: str, modules: dict) -> str | None:
    """The fedray module an imported dotted name lives in (a module, or a package's __init__)."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(mod: str, path: Path, modules: dict) -> set[str]:
    """Every fedray module ``mod`` imports, at any depth of its code (functions included)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = mod if is_pkg else mod.rpartition(".")[0]
                for _ in range(node.level - 1):
                    pkg = pkg.rpartition(".")[0]
                base = f"{pkg}.{base}" if base else pkg
            names = [f"{base}.{a.name}" for a in node.names] + [base]
        for n in names:
            if n == "fedray" or n.startswith("fedray."):
                target = _resolve(n, modules)
                if target and target != mod and not (target == "fedray" and n != "fedray"):
                    out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph = {m: _imports(m, p, modules) for m, p in modules.items()}
    # importing a.b.c first imports the packages a and a.b: edges to parent packages are not cycles of
    # the code, so they are left out (a package __init__ that imports its children is the usual case)
    return {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in graph.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_cycle_detector_finds_a_planted_cycle():
    g = _graph()
    g["fedray.core.io"] = g["fedray.core.io"] | {"fedray.engine.runner"}
    assert any("fedray.core.io" in c for c in _cycles(g))


def test_core_imports_nothing_else_of_fedray():
    g = _graph()
    upward = {m: sorted(t for t in ts if not t.startswith("fedray.core")) for m, ts in g.items()
              if m.startswith("fedray.core")}
    assert {m: ts for m, ts in upward.items() if ts} == {}


def test_algorithms_do_not_import_the_engine():
    g = _graph()
    bad = {m: sorted(t for t in ts if t.startswith("fedray.engine")) for m, ts in g.items()
           if m.startswith("fedray.algorithms")}
    assert {m: ts for m, ts in bad.items() if ts} == {}


def test_no_file_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in PKG.rglob("*.py") if (n := len(p.read_text().splitlines())) > 620}
    assert long == {}


def test_no_engine_function_over_80_lines():
    long = {}
    for p in (PKG / "engine").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 85:
                    long[f"{p.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    assert long == {}
