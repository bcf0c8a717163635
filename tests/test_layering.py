"""The package's shape: no import cycle among fedray's files (imports inside functions count), nothing
imports upward out of fedray/core, the engine never imports the driver, no file over 600 lines (tuning/'s over
300), no function over 80 lines in fedray/, tuning/ and jobs/, no import loop between those packages, and a Ray
driver's modules import no torch."""

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


def _imported_names(node: ast.AST, mod: str, is_pkg: bool) -> list[str]:
    """The dotted names an import statement ``node`` of module ``mod`` brings in (relative ones made absolute;
    ``from a import b`` gives ``a.b`` and ``a``); [] for any other node."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        pkg = mod if is_pkg else mod.rpartition(".")[0]
        for _ in range(node.level - 1):
            pkg = pkg.rpartition(".")[0]
        base = f"{pkg}.{base}" if base else pkg
    return [f"{base}.{a.name}" for a in node.names] + [base]


def _imports(mod: str, path: Path, modules: dict) -> set[str]:
    """Every fedray module ``mod`` imports, at any depth of its code (functions included)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(tree):
        names = _imported_names(node, mod, is_pkg)
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
    g["fedray.core.io"] = g["fedray.core.io"] | {"fedray.driver.runner"}
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


def test_the_engine_does_not_import_the_driver():
    """The driver (fedray/driver) runs the engine (coordinator, scheduler, workers); an import the other way would
    make the two packages one again."""
    g = _graph()
    assert any(t.startswith("fedray.engine") for m, ts in g.items() if m.startswith("fedray.driver") for t in ts)
    bad = {m: sorted(t for t in ts if t.startswith("fedray.driver")) for m, ts in g.items()
           if m.startswith("fedray.engine")}
    assert {m: ts for m, ts in bad.items() if ts} == {}


def test_no_function_over_80_lines():
    """Over fedray/, tuning/ and jobs/ (the engine's included): a function longer than 80 lines does two jobs."""
    long = {}
    for pkg in ("fedray", "tuning", "jobs"):
        for p in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    n = node.end_lineno - node.lineno + 1
                    if n > 80:
                        long[f"{p.relative_to(ROOT)}:{node.lineno} {node.name}"] = n
    assert long == {}


#: the modules a Ray run's driver imports to start: `fedray run`, `jobs.train` (`ray job submit`), every module of
#: the driver package (fedray/driver: the runner, set-up, the coordinator handle, the round loop, the early start of
#: the actors) and the engine's coordinator host (the class the driver starts the coordinator actor from). Their
#: module-level imports, followed through fedray, jobs and tuning, must never reach torch: torch-side code
#: (registries, models, the engine's coordinator and client runtimes) is imported inside functions that run in the
#: actors or in-process (tests/test_cli_imports.py checks a real run's driver too).
DRIVER_ENTRIES = ("fedray.cli", "jobs.train", *sorted(_module_name(p) for p in (PKG / "driver").glob("*.py")),
                  "fedray.engine.host", "fedray.plugins", "fedray.config", "fedray.core.plugin_loader")
HEAVY_AT_DRIVER_START = ("torch",)


def _module_level_imports(path: Path, mod: str) -> set[str]:
    """Every dotted name imported at module level (``if`` / ``try`` blocks included, function and class bodies
    not) by the file ``path`` of module ``mod``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out: set[str] = set()

    def visit(nodes):
        for node in nodes:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                out.update(_imported_names(node, mod, path.name == "__init__.py"))
            elif isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING"):
                continue  # never runs: names for the type checker only
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for h in getattr(node, "handlers", []):
                    visit(h.body)
                visit(getattr(node, "finalbody", []))

    visit(tree.body)
    return out


def _driver_closure() -> dict[str, list[str]]:
    """Module -> the chain of module-level imports that reaches it from :data:`DRIVER_ENTRIES`."""
    files = {}
    for pkg in ("fedray", "jobs", "tuning"):
        for p in (ROOT / pkg).rglob("*.py"):
            parts = list(p.relative_to(ROOT).with_suffix("").parts)
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    chains = {m: [m] for m in DRIVER_ENTRIES}
    todo = list(DRIVER_ENTRIES)
    while todo:
        mod = todo.pop()
        parents = [".".join(mod.split(".")[:i]) for i in range(1, mod.count(".") + 1)]  # packages run first
        for name in [*parents, *_module_level_imports(files[mod], mod)] if mod in files else []:
            target = next((name[:i] for i in sorted({len(name), *[k for k, c in enumerate(name) if c == "."]},
                                                     reverse=True) if name[:i] in files), None)
            key = target or name.split(".")[0]
            if key not in chains:
                chains[key] = [*chains[mod], key]
                if target:
                    todo.append(target)
    return chains


def test_a_ray_driver_s_modules_import_no_torch_at_module_level():
    chains = _driver_closure()
    assert {"fedray.config", "fedray.driver.launch", "fedray.driver.rounds", "fedray.core.ray_env"} <= set(chains)  # the walk reaches them
    bad = {m: " -> ".join(c) for m, c in chains.items() if m in HEAVY_AT_DRIVER_START}
    assert bad == {}


def test_the_driver_boundary_check_finds_a_planted_torch_import(tmp_path, monkeypatch):
    real = _module_level_imports
    monkeypatch.setitem(globals(), "_module_level_imports",
                        lambda path, mod: real(path, mod) | ({"torch"} if mod == "fedray.core.io" else set()))
    assert "torch" in _driver_closure()


# ------------------------------------------------------------------- fedray, tuning and jobs as packages
PACKAGES = ("fedray", "tuning", "jobs")
#: fedray's front doors, above both fedray's library and tuning: the command line (`fedray tune`) and the Python API
#: (`fedray.tune`). Only they may import tuning; nothing below them does.
FRONT = ("fedray.cli", "fedray.__main__", "fedray.api")


def _package_modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for p in (ROOT / pkg).rglob("*.py"):
            out[_module_name(p)] = p
    return out


def _package_imports(mod: str, path: Path, modules: dict) -> set[str]:
    """Every module of fedray, tuning or jobs that ``mod`` imports, at any depth of its code."""
    tree = ast.parse(path.read_text(), filename=str(path))
    out = set()
    for node in ast.walk(tree):
        for n in _imported_names(node, mod, path.name == "__init__.py"):
            target = _resolve(n, modules) if n.split(".")[0] in PACKAGES else None
            if target and target != mod and not mod.startswith(target + "."):
                out.add(target)
    return out


def _component(mod: str) -> str:
    if mod in FRONT:
        return "fedray (command line, Python API)"
    return mod.split(".")[0]


def _component_edges() -> dict[tuple[str, str], list[str]]:
    """(importing component, imported component) -> the module imports that make the edge."""
    modules = _package_modules()
    edges: dict[tuple[str, str], list[str]] = {}
    for mod, path in modules.items():
        for target in _package_imports(mod, path, modules):
            a, b = _component(mod), _component(target)
            if a != b:
                edges.setdefault((a, b), []).append(f"{mod} -> {target}")
    return edges


def test_fedray_below_its_front_doors_imports_neither_tuning_nor_jobs():
    bad = {k: v for k, v in _component_edges().items() if k[0] == "fedray" and k[1] in ("tuning", "jobs")}
    assert bad == {}


def test_no_import_loop_between_the_packages():
    """fedray's library, its front doors, tuning and jobs form no loop (imports inside functions count)."""
    edges = _component_edges()
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
    loops = _cycles(graph)
    assert loops == [], {str(c): [m for (a, b), ms in edges.items() if a in c and b in c for m in ms[:3]]
                         for c in loops}


def test_the_package_loop_detector_finds_a_planted_loop():
    edges = _component_edges()
    graph: dict[str, set[str]] = {}
    for a, b in [*edges, ("fedray", "tuning")]:
        graph.setdefault(a, set()).add(b)
    assert any("fedray" in c and "tuning" in c for c in _cycles(graph))


def test_no_file_over_600_lines_in_fedray_tuning_and_jobs_nor_over_300_in_tuning():
    limits = {"fedray": 600, "tuning": 300, "jobs": 600}
    long = {str(p.relative_to(ROOT)): n for pkg, limit in limits.items() for p in (ROOT / pkg).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > limit}
    assert long == {}
