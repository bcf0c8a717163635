"""The Python API for notebooks and scripts (docs/python-api.md): ``fedray.run``, ``fedray.load_run``,
``fedray.sweep``, ``fedray.tune`` and, in :mod:`fedray.data`, ``from_arrays`` / ``from_hf``.

``fedray.run`` builds the config as ``fedray run`` does (:func:`fedray.config.load_config` for a file, the same
overrides, the same checks) and runs it through the same code (:func:`fedray.cli.run_with_early_start`), so a config
gives the same run directory and the same final weights from a notebook as from the command line. Like the command,
a config whose run directory holds its finished run is not run again: its result is read back (``reused``).

Nothing heavy is imported here: the engine (torch; Ray for the ``ray`` backend) is imported when a function runs.

Code registered from a notebook's or script's ``__main__`` reaches only this process: a ``ray`` run that needs
it (algorithm, model, server optimizer, metric) is refused before anything starts (:func:`check_code_reaches`); its
runs are named after that code (:func:`_main_code_name`), as the code of ``plugins:`` is hashed into a run's name.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fedray.data as data  # noqa: F401  (fedray.data.from_arrays / from_hf; a light package)
from fedray.config_paths import get_path

__all__ = ["RunResult", "SweepResult", "Table", "TuneResult", "check_code_reaches", "load_run", "run", "sweep",
           "tune"]


class Table(list):
    """Rows as a list of dicts (one per round, point or trial), with :meth:`to_pandas` when pandas is there."""

    def column(self, name: str) -> list:
        """The values of ``name`` in every row (None where a row lacks it)."""
        return [row.get(name) for row in self]

    def to_pandas(self):
        """A DataFrame of the rows, nested dicts flattened into dotted columns (``seconds.train``)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Table.to_pandas needs pandas (pip install pandas); the rows themselves are plain "
                              "dicts") from None
        return pd.json_normalize(list(self)) if len(self) else pd.DataFrame()


def _quiet(*args, **kwargs) -> None:
    pass


# ------------------------------------------------------------------------------------------- results
@dataclass(repr=False)
class RunResult:
    """One run, as ``fedray.run`` returns it and :func:`load_run` reads it back from its run directory."""

    run_dir: Path
    status: str  # finished | stopped | interrupted | failed | running (run.json)
    config: dict  # the resolved config (config.yaml)
    metrics: Table  # one row per round (metrics.jsonl)
    summary: dict = field(default_factory=dict)  # final metrics (summary.json; empty until the run finishes)
    weights_hash: str = ""
    info: dict = field(default_factory=dict)  # run.json: config and partition hashes, source fingerprint, ...
    reused: bool = False  # fedray.run found this config's finished run and ran nothing
    failed: str | None = None
    startup_seconds: float | None = None  # this call's, when it ran the run
    rounds_seconds: float | None = None

    @property
    def rounds(self) -> Table:
        return self.metrics

    @property
    def accuracy(self) -> float:
        """Test accuracy at the last evaluated round (NaN when no round was evaluated)."""
        from fedray.reporting.rundir import last_accuracy

        return last_accuracy(self.metrics)

    @property
    def weights(self):
        """The final global weights (flat float32 numpy array, ``final_weights.npy``); None before the run finished."""
        if "_weights" not in self.__dict__:
            import numpy as np

            p = Path(self.run_dir) / "final_weights.npy"
            self.__dict__["_weights"] = np.load(p) if p.is_file() else None
        return self.__dict__["_weights"]

    def to_pandas(self):
        """The per-round metrics as a DataFrame (:meth:`Table.to_pandas`)."""
        return self.metrics.to_pandas()

    def __repr__(self) -> str:
        return (f"RunResult(run_dir={str(self.run_dir)!r}, status={self.status!r}, rounds={len(self.metrics)}, "
                f"accuracy={self.accuracy:.4f}, weights_hash={self.weights_hash!r}"
                + (", reused=True" if self.reused else "") + ")")


def load_run(run_dir: str | os.PathLike) -> RunResult:
    """The :class:`RunResult` of a run directory (finished or not), read from its files."""
    import yaml

    from fedray.config import ConfigError
    from fedray.reporting.rundir import RunDir

    rd = RunDir(run_dir)
    if not (rd.path / "run.json").is_file():
        raise ConfigError(f"load_run: {str(rd.path)!r} is not a run directory (no run.json)")
    info = rd.read_json("run.json")
    summary = rd.read_json("summary.json") if (rd.path / "summary.json").is_file() else {}
    cfg_file = rd.path / "config.yaml"
    config = (yaml.safe_load(cfg_file.read_text()) or {}) if cfg_file.is_file() else {}
    return RunResult(run_dir=rd.path, status=str(info.get("status", "?")), config=config,
                     metrics=Table(rd.read_metrics()), summary=summary,
                     weights_hash=str(summary.get("weights_hash") or ""), info=info, failed=info.get("error"))


# ------------------------------------------------------------------------------------------- the config
def _is_memory(value) -> bool:
    memory = sys.modules.get("fedray.data.memory")  # not imported: nothing can be in-memory data
    return memory is not None and isinstance(value, memory.InMemoryData)


def _merge(base: dict, over: Mapping) -> dict:
    """``over`` set into ``base`` (a copy), dicts merged key by key; in-memory data (:mod:`fedray.data.memory`)
    as ``data=`` or ``data.source`` chooses that source, with no ``root`` or ``params`` unless given."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if key == "data" and _is_memory(value):
            value = {"source": value}
        if key == "data" and isinstance(value, Mapping) and _is_memory(value.get("source")):
            rest = {k: v for k, v in value.items() if k not in ("source", "root", "params")}
            out["data"] = _merge(out.get("data") or {}, rest)
            out["data"].update(source=value["source"].source, root=value.get("root"),
                               params=copy.deepcopy(dict(value.get("params") or {})))
        elif isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(dict(value)) if isinstance(value, Mapping) else value
    return out


def _overrides(overrides: tuple, extra) -> list[str]:
    out: list[str] = []
    for ov in [*overrides, *([] if extra is None else [extra])]:
        out += [ov] if isinstance(ov, str) else list(ov)
    for ov in out:
        if not isinstance(ov, str) or "=" not in ov:
            from fedray.config import ConfigError

            raise ConfigError(f"override {ov!r}: expected a string 'a.b=c'")
    return out


def build_config(config=None, overrides=(), *, plugins=None, backend: str | None = None, fields=None):
    """The :class:`~fedray.config.ExperimentConfig` ``fedray.run`` runs: ``config`` (a file, as ``fedray run``
    reads it; a dict, whose relative ``plugins`` and ``data.root`` are taken from the working directory; or an
    ExperimentConfig, its plugins found again), with ``fields`` (config sections, merged), ``overrides`` (``a.b=c``),
    ``plugins`` (added; relative paths from the working directory) and ``backend`` (``engine.backend``)."""
    from fedray.config import (ConfigError, ExperimentConfig, anchor_to_file, apply_overrides, from_dict,
                               read_config_file)

    path, base_dir = None, os.getcwd()
    if isinstance(config, (str, os.PathLike)):
        path = Path(config)
        data_ = read_config_file(path)
    elif isinstance(config, ExperimentConfig):
        data_ = config.to_dict()
        data_.pop("plugin_code", None)  # the code is hashed as it is now (the object may predate an edit)
        source = data_.pop("source_path", None)
        if source:
            base_dir = str(Path(source).parent)
    elif isinstance(config, Mapping) or config is None:
        data_ = _merge({}, config or {})  # a copy (in-memory data as data.source chosen by its name)
    else:
        raise ConfigError(f"fedray.run: config must be a path, a dict or an ExperimentConfig, got "
                          f"{type(config).__name__}")
    data_ = apply_overrides(_merge(data_, fields or {}), list(overrides))
    if plugins:
        plugins = [plugins] if isinstance(plugins, str) else list(plugins)
        plugins = [str(Path(p).resolve()) if isinstance(p, str) and (p.endswith(".py") or "/" in p) else p
                   for p in plugins]
        data_["plugins"] = [*(data_.get("plugins") or []), *plugins]
    if backend is not None:
        data_["engine"] = {**(data_.get("engine") or {}), "backend": backend}
    if path is not None:
        data_ = anchor_to_file(data_, path)
        return from_dict(data_, source_path=str(path.resolve()))
    return from_dict(data_, base_dir=base_dir)


# ------------------------------------------------------------------------------------------- __main__ code
_ACTOR_KINDS = (("algorithm", "algorithm.name"), ("model", "model.name"), ("server optimizer", "server.name"),
                ("metric", "eval.metrics"))
_DRIVER_KINDS = (("data source", "data.source"), ("partitioner", "data.partition.name"))


def _owners(cfg, kinds) -> list[tuple[str, str, str, str, Any]]:
    """(kind, field, name, module, entry) of the registered names ``cfg`` chooses, for the registries this process
    has created (one it has not imported holds no name of the user's)."""
    from fedray.core.registry import ALL

    out = []
    for kind, path in kinds:
        reg = ALL.get(kind)
        node = get_path(cfg, path)
        for i, name in enumerate(node if isinstance(node, list) else [node]):
            if reg is not None and isinstance(name, str) and name in reg:
                where = f"{path}[{i}]" if isinstance(node, list) else path
                out.append((kind, where, name, reg.module(name), reg[name]))
    return out


def check_code_reaches(cfg) -> None:
    """On ``engine.backend: ray``, the coordinator and the client workers build the algorithm, the model, the server
    optimizer and the metrics from their names, importing the config's ``plugins``: a name registered by ``__main__`` (a
    notebook's cell) or by a module the plugins do not name cannot be found there. A ConfigError saying what to do,
    before anything starts. (Data sources and partitioners run in this process, the driver: they may come from
    anywhere.)"""
    from fedray.config import ConfigError
    from fedray.core.registry import is_builtin

    if cfg.engine.backend != "ray":
        return
    named = {m.split(".")[0] for m in cfg.plugin_code}
    for kind, path, name, module, _ in _owners(cfg, _ACTOR_KINDS):
        if module == "__main__":
            raise ConfigError(
                f"{path}: the {kind} {name!r} is registered by __main__ (this notebook or script), which the Ray "
                f"actors that build it cannot import: fedray sends them names, not code. Move that code into a module "
                f"file next to the notebook (e.g. mymethod.py) and name it in plugins (fedray.run(..., "
                f"plugins=['mymethod']) or plugins: [mymethod] in the config), or run with backend='local'")
        if not is_builtin(module) and module.split(".")[0] not in named:
            top = module.split(".")[0]
            raise ConfigError(f"{path}: the {kind} {name!r} is registered by the module {module!r}, which the config's "
                              f"plugins do not name, so the Ray actors would not import it: add it "
                              f"(fedray.run(..., plugins=[{top!r}]) or plugins: [{top}] in the config)")


def _digest_code(obj, h, seen: set) -> None:
    """Feed the source of ``obj`` (a class or function of ``__main__``) and of the ``__main__`` classes and functions
    it uses into ``h``; code without source (rare) by its compiled form."""
    if id(obj) in seen:
        return
    seen.add(id(obj))
    if inspect.isclass(obj):
        h.update(f"class {obj.__qualname__}\0".encode())
        for base in obj.__mro__[1:]:
            if base.__module__ == "__main__":
                _digest_code(base, h, seen)
        for key, value in sorted(vars(obj).items()):
            fn = getattr(value, "__func__", None) or getattr(value, "fget", None) or value
            if inspect.isfunction(fn):
                _digest_code(fn, h, seen)
            elif not key.startswith("__"):
                h.update(f"{key}={value!r}\0".encode())
        return
    if not inspect.isfunction(obj):
        h.update(f"{obj!r}\0".encode())
        return
    try:
        h.update(inspect.getsource(obj).encode())
    except (OSError, TypeError):
        import marshal

        h.update(marshal.dumps(obj.__code__))
    codes, names = [obj.__code__], set()
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes += [c for c in code.co_consts if inspect.iscode(c)]
    for name in sorted(names):
        used = obj.__globals__.get(name)
        if (inspect.isclass(used) or inspect.isfunction(used)) and getattr(used, "__module__", None) == "__main__":
            _digest_code(used, h, seen)


def _main_code_name(cfg) -> None:
    """A config that uses names registered by ``__main__`` (a notebook's cells, runnable on the local backend) runs
    in ``<algorithm>-<config hash>-main<digest of that code>`` unless ``output.name`` is set: edited code is another
    run directory, and the same code finds its finished run, as the code of ``plugins:`` does."""
    mains = [(name, entry) for _, _, name, module, entry in _owners(cfg, _ACTOR_KINDS + _DRIVER_KINDS)
             if module == "__main__"]
    if not mains or cfg.output.name:
        return
    from fedray.reporting.claim import default_run_name

    h, seen = hashlib.sha256(), set()
    for name, entry in mains:
        h.update(f"{name}\0".encode())
        targets = [entry] if inspect.isclass(entry) or inspect.isfunction(entry) else \
            [v for v in vars(entry).values() if callable(v)] if hasattr(entry, "__dict__") else [entry]
        for t in targets:
            _digest_code(t, h, seen)
    cfg.output.name = f"{default_run_name(cfg)}-main{h.hexdigest()[:8]}"


# ------------------------------------------------------------------------------------------- run
def run(config=None, *overrides, plugins=None, backend: str | None = None, quiet: bool = True,
        overwrite: bool = False, resume=None, **fields) -> RunResult:
    """Run one experiment to the end and return its :class:`RunResult` (docs/python-api.md).

    ``config``: a YAML/TOML file (read as ``fedray run`` reads it), a dict (a config file's contents; relative
    paths from the working directory) or an ExperimentConfig. ``overrides``: ``"a.b=c"`` strings (also a list, or
    ``overrides=[...]``). ``fields``: config sections to merge, e.g. ``train={"rounds": 3}``, ``seed=1``,
    ``data=fedray.data.from_arrays(...)``. ``plugins``: module names or paths added to the config's ``plugins``.
    ``backend``: ``"local"`` (in this process) or ``"ray"`` (the Ray this process joined, else ``engine.ray_address``,
    ``RAY_ADDRESS``, a running ``fedray up``, else a private local one, started once and reused by later calls).
    ``quiet``: no log lines, no progress bar. ``overwrite``: run again over an earlier run in the run directory.
    ``resume``: continue the run in that run directory (then no other argument).

    Bad input raises :class:`~fedray.config.ConfigError` naming the field before anything starts; a run that cannot
    produce a trustworthy result raises (``run.json`` says ``failed``)."""
    from fedray.config import ConfigError, load_config

    log = _quiet if quiet else print
    extra = fields.pop("overrides", None)
    if resume is not None:
        if config is not None or overrides or extra or plugins or backend or fields:
            raise ConfigError("fedray.run(resume=RUN_DIR) continues that run with its own config.yaml: give no config, "
                              "overrides, plugins, backend or fields with it")
        cfg, cfg_path = None, Path(resume) / "config.yaml"
        if not cfg_path.is_file():
            raise ConfigError(f"resume={str(resume)!r}: not a run directory (no config.yaml)")
        check_code_reaches(load_config(cfg_path))
    else:
        cfg = build_config(config, _overrides(overrides, extra), plugins=plugins, backend=backend, fields=fields)
        check_code_reaches(cfg)
        _main_code_name(cfg)
    from fedray.cli import FinishedRun, run_with_early_start

    res = run_with_early_start(cfg, resume, t0=None, warm=True, log=log, progress=False if quiet else None,
                               overwrite=overwrite)
    out = load_run(res.run_dir)
    if isinstance(res, FinishedRun):
        log(f"[fedray] {res.run_dir} already holds this config's finished run: nothing was run (overwrite=True runs "
            f"it again)")
        out.reused = True
        return out
    out.weights_hash = res.weights_hash or out.weights_hash
    out.startup_seconds, out.rounds_seconds = res.startup_seconds, res.rounds_seconds
    return out


# ------------------------------------------------------------------------------------------- sweep, tune
@dataclass
class SweepResult:
    """What ``fedray.sweep`` leaves (docs/sweep.md): one row per point (the columns of ``sweep.parquet``)."""

    output_dir: Path
    rows: Table
    tables: str  # tables.md: the paper-style tables as Markdown ('' without a table)
    files: list[Path]
    failed: Table  # the rows of the points that failed (a sweep goes on past them)
    interrupted: bool = False

    def to_pandas(self):
        return self.rows.to_pandas()


def sweep(sweep_file, *overrides, output_dir=None, resume: bool = False, quiet: bool = True) -> SweepResult:
    """Run a sweep (``fedray sweep``): ``sweep_file`` a sweep YAML file or its contents as a dict (relative paths
    from the working directory), ``overrides`` of its base experiment; ``resume`` keeps the finished points."""
    from fedray.apps.sweep import run_sweep
    from fedray.apps.sweep_spec import load_sweep

    ovs = _overrides(overrides, None)
    if isinstance(sweep_file, Mapping):
        spec = load_sweep(data=dict(sweep_file), overrides=ovs, output_dir=output_dir)
    else:
        spec = load_sweep(sweep_file, overrides=ovs, output_dir=output_dir)
    res = run_sweep(spec, resume=resume, log=_quiet if quiet else print)
    md = spec.output_dir / "tables.md"
    return SweepResult(Path(spec.output_dir), Table(res.rows), md.read_text() if md.is_file() else "",
                       list(res.files), Table(res.failed), res.interrupted)


@dataclass
class TuneResult:
    """What ``fedray.tune`` leaves (docs/tuning.md): one row per trial (the columns of ``trials.csv``)."""

    study_dir: Path
    trials: Table
    best_config: Path | None  # best_config.yaml (single objective, once a trial completed)
    counts: dict  # trials by state
    outputs: list[Path]
    interrupted: bool = False

    def to_pandas(self):
        return self.trials.to_pandas()


def _csv_rows(path: Path) -> Table:
    import csv

    def value(text: str):
        if text == "":
            return None
        for cast in (int, float):
            try:
                return cast(text)
            except ValueError:
                pass
        return text

    if not path.is_file():
        return Table()
    with open(path, newline="") as f:
        return Table({k: value(v) for k, v in row.items()} for row in csv.DictReader(f))


def tune(study_file, *overrides, storage: str | None = None, resume: bool = False, output_dir=None,
         quiet: bool = True) -> TuneResult:
    """Run an Optuna study file (``fedray tune``), ``overrides`` (``a.b=c``) of its base config; ``resume`` continues
    it (finished trials kept)."""
    from tuning.driver import tune as run_study

    res = run_study(study_file, *_overrides(overrides, None), storage=storage, resume=resume, output_dir=output_dir,
                    log=_quiet if quiet else print)
    best = Path(res.study_dir) / "best_config.yaml"
    return TuneResult(Path(res.study_dir), _csv_rows(Path(res.study_dir) / "trials.csv"),
                      best if best.is_file() else None, dict(res.counts), list(res.outputs), res.interrupted)
