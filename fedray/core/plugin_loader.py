"""Plugins: the user's own modules that register algorithms, models, data sources, partitioners, server
optimizers and metrics, named in a config's ``plugins:`` list (docs/extending.md).

Two steps, both stdlib only:

* :func:`resolve` (the driver, when the config is read; imports nothing): finds each entry's files, and records
  for it the sha256 **digest** of its source files (``plugin_code``, part of the config hash, so edited code
  gets a new run directory) and the directory it was found in (``plugin_roots``, not hashed). A digest the
  config already records (``--resume``, a copied ``config.yaml``) that differs from the code found now is
  refused, naming both.
* :func:`load` (every process that builds something: the driver for data plugins, the coordinator, every
  client worker): imports each plugin once per process, then checks that the code it imported has the
  recorded digest (a node with a stale copy fails, naming the node) and that it registered something.

An entry is a module or package name (``mymethod``, ``mylab.methods``), the name of an installed
distribution's ``fedray.plugins`` entry point (loaded only when named, as ``pytest -p`` does), or a path to a
``.py`` file or a package directory relative to the config file (``methods/mymethod.py``). Names are searched
for in the config's directory, the working directory, ``sys.path``, then the entry points. Errors are
:class:`~fedray.core.errors.ConfigError` naming ``plugins[i]``.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import socket
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from fedray.core import registry
from fedray.core.errors import ConfigError

__all__ = ["ENTRY_POINT_GROUP", "Located", "digest_files", "load", "locate", "provenance", "py_modules", "resolve",
           "source_files"]

ENTRY_POINT_GROUP = "fedray.plugins"
_SKIP_DIRS = {"__pycache__", ".git", ".hg", ".svn", ".tox", ".venv", "venv", "node_modules", ".mypy_cache",
              ".pytest_cache", ".ruff_cache", "build", "dist"}
#: plugins this process imported: module name -> digest of the code imported
_LOADED: dict[str, str] = {}


@dataclass(frozen=True)
class Located:
    """Where a plugin entry's code is: ``module`` (the name to import), ``root`` (the directory that must be on
    ``sys.path`` for it), ``path`` (its file or package directory), ``origin`` (how it was found)."""

    module: str
    root: str
    path: str
    origin: str


def _is_path(entry: str) -> bool:
    return entry.endswith(".py") or "/" in entry or os.sep in entry or entry.startswith(".")


def _locate_path(entry: str, where: str, base_dir: str | None, roots: dict[str, str]) -> Located:
    """A path entry: relative to the directory recorded for its module when that exists, else to ``base_dir``."""
    rel = Path(os.path.expanduser(entry.rstrip("/") if entry.endswith("/") else entry))
    name = rel.stem if rel.suffix == ".py" else rel.name
    recorded = roots.get(name)
    if recorded and os.path.isdir(recorded):
        p = Path(recorded) / (f"{name}.py" if rel.suffix == ".py" else name)
    else:
        p = rel if rel.is_absolute() else Path(base_dir or os.getcwd()) / rel
    p = p.resolve()
    if not p.exists():
        raise ConfigError(f"{where}: {entry!r}: no such file or directory ({p})")
    if p.is_file() and p.suffix != ".py":
        raise ConfigError(f"{where}: {entry!r}: a plugin file must end in .py")
    if p.is_dir() and not (p / "__init__.py").is_file():
        raise ConfigError(f"{where}: {entry!r}: the directory {p} is not a Python package (no __init__.py)")
    if not name.isidentifier():
        raise ConfigError(f"{where}: {entry!r}: {name!r} is not a valid module name")
    return Located(name, str(p.parent), str(p), f"path {p}")


def _find_top(top: str, dirs: list[str]) -> tuple[str, str] | None:
    """``(root, path)`` of the top-level module or package ``top`` in the first of ``dirs`` that has it."""
    for d in dirs:
        if not d:
            d = os.getcwd()
        spec = importlib.machinery.PathFinder.find_spec(top, [d])
        if spec is None:
            continue
        if spec.submodule_search_locations:  # a package (regular or namespace)
            locs = list(spec.submodule_search_locations)
            return d, locs[0]
        if spec.origin and spec.origin.endswith(".py"):
            return d, spec.origin
        if spec.origin:  # an extension module: no source to digest
            return d, spec.origin
    return None


def _entry_point(name: str):
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep
    return None


def locate(entry: str, index: int, *, base_dir: str | None, roots: dict[str, str] | None = None) -> Located:
    """Where ``plugins[index] = entry`` is, without importing it. ``roots``: the directories an earlier
    :func:`resolve` of the same config recorded; where one exists on this machine it is looked in first (the
    process imports exactly the files the config was resolved with), then (names) the config's directory
    ``base_dir``, the working directory, ``sys.path`` and the entry points, or (paths) ``base_dir``."""
    where = f"plugins[{index}]"
    if not isinstance(entry, str) or not entry.strip():
        raise ConfigError(f"{where}: expected a module name or a path to a .py file or package directory, got {entry!r}")
    entry = entry.strip()
    if _is_path(entry):
        return _locate_path(entry, where, base_dir, roots or {})
    parts = entry.split(".")
    is_name = all(part.isidentifier() for part in parts)
    found = None
    if is_name:
        recorded = (roots or {}).get(entry)
        dirs = ([recorded] if recorded else []) + ([base_dir] if base_dir else [])
        dirs += [os.getcwd()] + [d for d in sys.path if d not in ("", os.getcwd())]
        found = _find_top(parts[0], [d for d in dirs if d and os.path.isdir(d)])
    if found is None:
        ep = _entry_point(entry)
        if ep is not None:
            module = ep.value.split(":", 1)[0].strip()
            return _locate_module(module, where, roots, f"entry point {ENTRY_POINT_GROUP}:{entry} of "
                                                        f"{ep.dist.name if ep.dist else '?'}")
        if not is_name:
            raise ConfigError(f"{where}: {entry!r} is not a module name, a path ending in .py or /, nor an entry "
                              f"point of {ENTRY_POINT_GROUP}")
    if found is None:
        looked = ", ".join(x for x in ([f"{base_dir} (the config's directory)"] if base_dir else [])
                           + [f"{os.getcwd()} (the working directory)", "sys.path",
                              f"entry points {ENTRY_POINT_GROUP}"])
        raise ConfigError(f"{where}: no module {entry!r} in {looked}")
    return _checked(entry, parts, found, where, "found in")


def _locate_module(module: str, where: str, roots: dict | None, origin: str) -> Located:
    """The module an entry point names, on this machine (its recorded directory first)."""
    parts = module.split(".")
    recorded = (roots or {}).get(module)
    dirs = ([recorded] if recorded else []) + [d for d in sys.path if d]
    found = _find_top(parts[0], [d for d in dirs if os.path.isdir(d)])
    if found is None:
        raise ConfigError(f"{where}: {origin} names the module {module!r}, which is not installed here")
    return _checked(module, parts, found, where, origin)


def _checked(entry: str, parts: list[str], found: tuple[str, str], where: str, origin: str) -> Located:
    root, path = found
    if len(parts) > 1:  # a submodule: it must exist inside the package found
        sub = Path(path).joinpath(*parts[1:-1])
        if not ((sub / f"{parts[-1]}.py").is_file() or (sub / parts[-1] / "__init__.py").is_file()):
            raise ConfigError(f"{where}: package {parts[0]!r} ({path}) has no module {entry!r}")
    return Located(entry, root, path, f"{origin} {root}")


def source_files(path: str) -> list[Path]:
    """The files of a plugin whose bytes make its digest: the file itself, or every ``.py`` file of the package
    directory (cache and tool directories skipped), sorted."""
    p = Path(path)
    if p.is_file():
        return [p]
    out = []
    for dirpath, dirnames, filenames in os.walk(p):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS and not d.startswith("."))
        out += [Path(dirpath) / f for f in filenames if f.endswith(".py")]
    return sorted(out)


def digest_files(path: str) -> str:
    """``sha256:<16 hex>`` over the relative paths and bytes of :func:`source_files`."""
    p = Path(path)
    h = hashlib.sha256()
    for f in source_files(path):
        rel = f.name if p.is_file() else f.relative_to(p).as_posix()
        data = f.read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return "sha256:" + h.hexdigest()[:16]


def _changed(where: str, name: str, now: str, recorded: str, path: str) -> ConfigError:
    return ConfigError(f"{where}: the code of {name!r} ({path}) is {now}, but this config records {recorded}: it "
                       f"changed since the run (or config) was made: restore that code to continue the run, or run "
                       f"the original config file again (a new run directory)")


def resolve(plugins: list, *, base_dir: str | None, recorded: dict | None = None,
            roots: dict | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """``(plugin_code, plugin_roots)`` of a config's ``plugins`` list: the digest and the directory of each entry's
    module, keyed by module name. ``recorded``: the digests the config holds already; one that differs from
    the code found is refused (:func:`_changed`), as is a recorded name no entry names."""
    recorded = dict(recorded or {})
    code: dict[str, str] = {}
    found_roots: dict[str, str] = {}
    for i, entry in enumerate(plugins):
        loc = locate(entry, i, base_dir=base_dir, roots=roots)
        if loc.module in code:
            raise ConfigError(f"plugins[{i}]: {entry!r} names the module {loc.module!r} a second time")
        digest = digest_files(loc.path)
        if loc.module in recorded and recorded[loc.module] != digest:
            raise _changed(f"plugins[{i}]", loc.module, digest, recorded[loc.module], loc.path)
        code[loc.module] = digest
        found_roots[loc.module] = loc.root
    extra = sorted(set(recorded) - set(code))
    if extra:
        raise ConfigError(f"plugin_code: records {extra[0]!r}, which no entry of plugins names")
    return code, found_roots


def _where_raised(err: BaseException) -> str:
    frames = traceback.extract_tb(err.__traceback__)
    user = [f for f in frames if "importlib" not in f.filename]
    last = (user or frames)
    return f" ({last[-1].filename}:{last[-1].lineno})" if last else ""


def _forget(top: str) -> None:
    """Drop the package ``top`` and its submodules from ``sys.modules`` and what they registered, so that the next
    import runs the code on disk."""
    for name in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
        del sys.modules[name]
    for r in registry.ALL.values():
        r._remove_owned_by(top)
    for name in [m for m in _LOADED if m == top or m.startswith(top + ".")]:
        del _LOADED[name]
    importlib.invalidate_caches()


def _module_path(mod) -> str | None:
    locs = getattr(mod, "__path__", None)
    if locs:
        return list(locs)[0]
    return getattr(mod, "__file__", None)


def load(plugins: list, code: dict[str, str], roots: dict[str, str] | None = None) -> list[str]:
    """Import every plugin of a resolved config in this process (once: a second call for the same code is a
    no-op) and check it: the code imported has the digest ``code`` records, naming this node otherwise, and it
    registered at least one name. ``roots``: the directories :func:`resolve` recorded, looked in first where
    they exist (the driver's machine), else the working directory and ``sys.path`` (a cluster's working dir). A plugin this process
    imported before with other code (a notebook's second run after an edit, or the user's own ``import``) is
    imported afresh, its old registrations dropped, so that what runs is what was hashed. The module names."""
    node = socket.gethostname()
    located = []
    for i, entry in enumerate(plugins or []):
        try:
            loc = locate(entry, i, base_dir=None, roots=roots)
        except ConfigError as e:
            raise ConfigError(f"{e} (on node {node}, pid {os.getpid()})") from None
        if registry.is_builtin(loc.module):
            raise ConfigError(f"plugins[{i}]: {loc.module!r} is part of fedray, not a plugin")
        if code.get(loc.module) is None:
            raise ConfigError(f"plugins[{i}]: {loc.module!r} has no digest in plugin_code (the config was not resolved)")
        located.append(loc)
    stale = {loc.module.split(".")[0] for loc in located if _LOADED.get(loc.module) != code[loc.module]}
    for top in stale:  # imported before with other code, or by someone else: import what was hashed
        if top in sys.modules:
            _forget(top)
    names = []
    for i, loc in enumerate(located):
        where = f"plugins[{i}]"
        module, want, top = loc.module, code[loc.module], loc.module.split(".")[0]
        if _LOADED.get(module) == want:
            names.append(module)
            continue
        if loc.root not in sys.path:
            sys.path.insert(0, loc.root)
        before = {k: set(r) for k, r in registry.ALL.items()}
        try:
            mod = importlib.import_module(module)
        except ConfigError as e:
            raise ConfigError(f"{where}: importing {module!r} failed: {e}") from None
        except Exception as e:  # noqa: BLE001 - any error of the user's module
            raise ConfigError(f"{where}: importing {module!r} failed: {type(e).__name__}: {e}{_where_raised(e)}") \
                from None
        path = _module_path(sys.modules.get(top) if top != module else mod) or loc.path
        have = digest_files(path)
        if have != want:
            raise ConfigError(f"{where}: node {node} imported {module!r} from {path} with digest {have}, but the run's "
                              f"driver hashed {want}: this node has other code; ship the same files (a working dir, "
                              f"an installed package or the same checkout on every node)")
        if not any(r.owned_by(top) for r in registry.ALL.values()) and \
                all(set(r) == before.get(k, set()) for k, r in registry.ALL.items()):
            raise ConfigError(f"{where}: {module!r} registered nothing (no fedray.register_algorithm / register_model "
                              f"/ register_source / register_partitioner / register_server_optimizer / "
                              f"register_metric call ran when it was imported)")
        _LOADED[module] = want
        names.append(module)
    return names


def provenance(code: dict[str, str], roots: dict[str, str]) -> dict[str, dict]:
    """What ``run.json`` records of each plugin: its digest, where it was found and, for a module that belongs to
    an installed distribution, that distribution's name and version."""
    from importlib.metadata import PackageNotFoundError, packages_distributions, version

    dists = packages_distributions()
    out = {}
    for module, digest in code.items():
        rec = {"digest": digest, "root": roots.get(module)}
        for dist in dists.get(module.split(".")[0], []):
            try:
                rec.update(distribution=dist, version=version(dist))
            except PackageNotFoundError:
                continue
            break
        out[module] = rec
    return out


def _package_limit() -> int:
    """The largest package Ray's runtime env takes (its gRPC message limit, 512 MiB with Ray 2.60)."""
    try:
        from ray._private.runtime_env.packaging import GCS_STORAGE_MAX_SIZE

        return int(GCS_STORAGE_MAX_SIZE)
    except Exception:  # noqa: BLE001 - another Ray: its documented default
        return 512 * 1024 * 1024


def py_modules(plugins: list, code: dict[str, str], roots: dict[str, str], *, cwd: str | None = None) -> list[str]:
    """The plugin files and package directories a run that joins a Ray cluster by address ships to its nodes
    through Ray's ``runtime_env={"py_modules": ...}``: every plugin except those under ``cwd`` (the working
    directory, which ``ray job submit --working-dir`` unpacks on every node) and those of installed
    distributions (site-packages: installed on the cluster's image, or refused there by the digest check).
    One larger than Ray takes is refused, naming it."""
    cwd = os.path.realpath(cwd or os.getcwd())
    out = []
    for i, entry in enumerate(plugins or []):
        loc = locate(entry, i, base_dir=None, roots=roots)
        path = os.path.realpath(loc.path)
        if path == cwd or path.startswith(cwd + os.sep) or "site-packages" in Path(path).parts \
                or "dist-packages" in Path(path).parts:
            continue
        top = Path(path)  # the file, or the top-level package directory (a submodule's package whole)
        size = sum(f.stat().st_size for f in ([top] if top.is_file() else top.rglob("*"))
                   if f.is_file() and "__pycache__" not in f.parts)
        if size > _package_limit():
            raise ConfigError(f"plugins[{i}]: {loc.module!r} ({path}) holds {size / 2**20:.0f} MiB, more than the "
                              f"{_package_limit() / 2**20:.0f} MiB Ray ships to a cluster's nodes; install it on the "
                              f"nodes or submit the run with `ray job submit --working-dir` from a smaller directory")
        out.append(str(top))
    return out
