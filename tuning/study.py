"""The study file: YAML, parsed and checked before any trial runs (:func:`load_study` -> :class:`StudySpec`).

A study file looks like this (every key but ``base_config`` and ``params`` has a default)::

    name: fedprox_mu                 # study name in the storage (default: the file name without .yaml)
    description: FedProx mu on MNIST
    base_config: ../../jobs/configs/fedprox_mnist.yaml   # a path (relative to this file) or an inline mapping
    base_overrides: [train.rounds=20]                    # optional a.b=c edits of the base config
    params:                                              # search space, one entry per dotted config path
      algorithm.params.mu: {type: float, low: 1.0e-4, high: 1.0, log: true}
      train.lr:            {type: float, low: 0.01, high: 0.1, step: 0.01}
      train.local_epochs:  {type: int, low: 1, high: 5}
      model.name:          {type: categorical, choices: [fedavg_cnn, cnn4]}
    objective: {metric: ema_accuracy, direction: maximize}
    # or, instead of objective (no pruning then):
    # multi_objective: [{metric: accuracy, direction: maximize}, {metric: bytes_total, direction: minimize}]
    budget: {n_trials: 40, timeout_s: null, max_consecutive_failures: 3}
    sampler: {name: tpe, seed: 0, n_startup_trials: 10}  # tpe (default) | random | grid
    pruner: {name: hyperband, min_resource: 2, reduction_factor: 3}   # hyperband (default) | median | none
    storage: null                    # default: journal file <study dir>/journal.log; or postgresql://user@host/db
    concurrency: 2                   # trials at once (capped by the cluster's resources)
    trial_resources: {workers: 2, cpus_per_worker: 1, gpus_per_worker: 0}
    output_dir: runs/studies         # the study directory is <output_dir>/<name>
    enqueue: [{algorithm.params.mu: 0.001}]            # known-good points to try first (once)

Objective metrics: :mod:`tuning.objective`. The command line's ``a.b=c`` overrides edit the base config after
``base_overrides`` (a searched path cannot be overridden). :func:`load_study` raises
:class:`fedray.config.ConfigError` with the dotted name of the offending field (``params.train.lrr: ...``,
``sampler.name: ...``) for every mistake it can see, the config ones through :func:`tuning.checks.check_config`.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import yaml

from fedray.config import ConfigError, anchor_to_file, apply_overrides, parse_override, read_config_file
from tuning.checks import check_config
from tuning.objective import parse_objective
from tuning.space import (Objective, PrunerSpec, SamplerSpec, SearchParam, StudySpec, TrialResources, as_int,
                          as_mapping, as_number)

SAMPLERS = {
    "tpe": {"seed": int, "n_startup_trials": int, "multivariate": bool, "constant_liar": bool},
    "random": {"seed": int},
    "grid": {"seed": int},
}
PRUNERS = {
    "hyperband": {"min_resource": int, "max_resource": int, "reduction_factor": int, "patience": int},
    "median": {"n_startup_trials": int, "n_warmup_steps": int, "interval_steps": int, "n_min_trials": int,
               "patience": int},
    "none": {},
}
_TOP_KEYS = ("name", "description", "base_config", "base_overrides", "params", "objective", "multi_objective",
             "budget", "sampler", "pruner", "storage", "concurrency", "trial_resources", "output_dir", "enqueue")


def _typed(value, typ, where: str):
    if typ is int:
        return as_int(value, where, 0)
    if typ is bool and not isinstance(value, bool):
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    return value


def _parse_named(raw, where: str, table: dict, default: str) -> tuple[str, dict]:
    if raw is None:
        return default, {}
    if isinstance(raw, str):
        raw = {"name": raw}
    raw = as_mapping(raw, where)
    name = raw.get("name", default)
    if name not in table:
        raise ConfigError(f"{where}.name: unknown {where} {name!r} (known: {', '.join(table)})")
    opts = {k: v for k, v in raw.items() if k != "name"}
    allowed = table[name]
    for k, v in opts.items():
        if k not in allowed:
            raise ConfigError(f"{where}.{k}: unknown option for {where} {name!r} (known: {', '.join(allowed) or 'none'})")
        opts[k] = _typed(v, allowed[k], f"{where}.{k}")
    return name, opts


def _load_base(raw, study_dir: Path | None) -> tuple[dict, str | None]:
    if raw is None:
        raise ConfigError("base_config: required (a config file path or an inline mapping)")
    if isinstance(raw, dict):
        return (anchor_to_file(raw, study_dir / "study.yaml") if study_dir is not None else copy.deepcopy(raw)), None
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError(f"base_config: expected a config file path or a mapping, got {raw!r}")
    p = Path(os.path.expanduser(raw))
    cands = [p] if p.is_absolute() else [*([study_dir / p] if study_dir is not None else []), Path.cwd() / p]
    for c in cands:
        if c.is_file():
            try:
                data = read_config_file(c)
            except ConfigError as e:
                raise ConfigError(f"base_config: {e}") from None
            return anchor_to_file(data, c), str(c.resolve())
    raise ConfigError(f"base_config: file {raw!r} not found (looked in {', '.join(str(c) for c in cands)})")


def _base(data: dict, study_dir: Path | None, overrides: list[str]) -> tuple[dict, str | None]:
    """The base config mapping (``base_overrides``, then the command line's), and the file it came from."""
    base, base_path = _load_base(data.get("base_config"), study_dir)
    ovs = data.get("base_overrides") or []
    if not isinstance(ovs, list) or not all(isinstance(o, str) for o in ovs):
        raise ConfigError(f"base_overrides: expected a list of 'a.b=c' strings, got {ovs!r}")
    try:
        base = apply_overrides(base, ovs)
    except ConfigError as e:
        raise ConfigError(f"base_overrides: {e}") from None
    return apply_overrides(base, overrides), base_path


def _objectives(data: dict) -> tuple[list[Objective], bool]:
    """(objectives, multi-objective?)."""
    if data.get("multi_objective") is None:
        return [parse_objective(data.get("objective") or {}, "objective")], False
    if data.get("objective") is not None:
        raise ConfigError("multi_objective: give either objective or multi_objective, not both")
    mo = data["multi_objective"]
    if not isinstance(mo, list) or len(mo) < 2:
        raise ConfigError(f"multi_objective: expected a list of at least two {{metric, direction}} mappings, got {mo!r}")
    objectives = [parse_objective(o, f"multi_objective[{i}]") for i, o in enumerate(mo)]
    if len({o.metric for o in objectives}) != len(objectives):
        raise ConfigError("multi_objective: the same metric appears twice")
    return objectives, True


def _resources(data: dict) -> TrialResources:
    tr = as_mapping(data.get("trial_resources"), "trial_resources", ("workers", "cpus_per_worker", "gpus_per_worker"))
    where = "trial_resources."
    return TrialResources(
        workers=None if tr.get("workers") is None else as_int(tr["workers"], where + "workers", 1),
        cpus_per_worker=(None if tr.get("cpus_per_worker") is None
                         else as_number(tr["cpus_per_worker"], where + "cpus_per_worker", 0.0)),
        gpus_per_worker=(None if tr.get("gpus_per_worker") is None
                         else as_number(tr["gpus_per_worker"], where + "gpus_per_worker", 0.0)))


def _settings(data: dict) -> dict:
    """The budget, storage, concurrency, trial resources and output directory of a study file."""
    budget = as_mapping(data.get("budget"), "budget", ("n_trials", "timeout_s", "max_consecutive_failures"))
    timeout = budget.get("timeout_s")
    storage = data.get("storage")
    if storage is not None and (not isinstance(storage, str) or not storage.strip()):
        raise ConfigError(f"storage: expected a URL (postgresql://...) or a journal file path, got {storage!r}")
    out = data.get("output_dir")
    if out is not None and (not isinstance(out, str) or not out.strip()):
        raise ConfigError(f"output_dir: expected a directory path, got {out!r}")
    return {"n_trials": as_int(budget.get("n_trials", 20), "budget.n_trials", 1),
            "timeout_s": None if timeout is None else as_number(timeout, "budget.timeout_s", 0.0, strict=True),
            "max_consecutive_failures": as_int(budget.get("max_consecutive_failures", 3),
                                               "budget.max_consecutive_failures", 1),
            "storage": storage, "concurrency": as_int(data.get("concurrency", 1), "concurrency", 1),
            "trial_resources": _resources(data), "output_dir": out}


def _check_overrides(params: list[SearchParam], overrides: list[str]) -> None:
    for ov in overrides:
        path = ".".join(parse_override(ov)[0])
        clash = [p.path for p in params if p.path == path or p.path.startswith(path + ".")
                 or path.startswith(p.path + ".")]
        if clash:
            raise ConfigError(f"override {ov!r}: {clash[0]} is searched by the study (params:); change its range "
                              f"there")


def _enqueue(spec: StudySpec, raw) -> None:
    if not isinstance(raw, list):
        raise ConfigError(f"enqueue: expected a list of {{param path: value}} mappings, got {raw!r}")
    for i, point in enumerate(raw):
        point = as_mapping(point, f"enqueue[{i}]", [p.path for p in spec.params])
        for path, v in point.items():
            spec.param(path).check_value(v, f"enqueue[{i}].{path}")
        spec.enqueue.append(dict(point))


def _check_hyperband(spec: StudySpec) -> None:
    opts = spec.pruner.options
    mr = opts.get("max_resource", spec.max_rounds())
    if opts.get("min_resource", 1) < 1 or opts.get("min_resource", 1) > mr:
        raise ConfigError(f"pruner.min_resource: must be in [1, {mr}] (the number of rounds), "
                          f"got {opts.get('min_resource')!r}")
    if opts.get("reduction_factor", 3) < 2:
        raise ConfigError(f"pruner.reduction_factor: must be >= 2, got {opts['reduction_factor']!r}")


def parse_study(data: dict, *, source_path: str | Path | None = None, check_registries: bool = True,
                overrides: list[str] | None = None) -> StudySpec:
    """Build and validate a :class:`StudySpec` from a study mapping (see the module docstring); ``overrides``
    (``a.b=c``) edit its base config after ``base_overrides``."""
    if not isinstance(data, dict):
        raise ConfigError(f"study file: the top level must be a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - set(_TOP_KEYS))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown key in the study file (known: {', '.join(_TOP_KEYS)})")
    study_dir = Path(source_path).resolve().parent if source_path else None
    name = data.get("name") or (Path(source_path).stem if source_path else None)
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name or ""):
        raise ConfigError(f"name: expected a study name of letters, digits, '_', '-', '.', got {name!r}")
    description = data.get("description") or ""
    if not isinstance(description, str):
        raise ConfigError(f"description: expected a string, got {description!r}")
    base, base_path = _base(data, study_dir, list(overrides or []))

    # sampler before params: the grid sampler needs enumerable parameters
    s_name, s_opts = _parse_named(data.get("sampler"), "sampler", SAMPLERS, "tpe")
    raw_params = data.get("params")
    if not isinstance(raw_params, dict) or not raw_params:
        raise ConfigError("params: expected a non-empty mapping of dotted config paths to ranges, "
                          "e.g. {algorithm.params.mu: {type: float, low: 1.0e-4, high: 1, log: true}}")
    params = [SearchParam.parse(path, spec) for path, spec in raw_params.items()]
    if s_name == "grid":
        for p in params:
            p.grid_values()
    _check_overrides(params, list(overrides or []))
    objectives, multi = _objectives(data)
    p_name, p_opts = _parse_named(data.get("pruner"), "pruner", PRUNERS, "none" if multi else "hyperband")
    if multi and p_name != "none":
        raise ConfigError(f"pruner.name: {p_name!r} cannot be used with multi_objective (Optuna does not prune "
                          f"multi-objective trials); use none")
    spec = StudySpec(name=name, base_config=base, params=params, objectives=objectives, multi_objective=multi,
                     sampler=SamplerSpec(s_name, s_opts.pop("seed", 0), s_opts), pruner=PrunerSpec(p_name, p_opts),
                     description=description, source_path=str(Path(source_path).resolve()) if source_path else None,
                     base_config_path=base_path, overrides=list(overrides or []), **_settings(data))
    _enqueue(spec, data.get("enqueue") or [])
    if spec.pruning and p_name == "hyperband":
        _check_hyperband(spec)
    check_config(spec, check_registries=check_registries)
    return spec


def load_study(path: str | Path, *, check_registries: bool = True, overrides: list[str] | None = None) -> StudySpec:
    """Read and validate a study YAML file, with the command line's ``overrides`` of its base config.
    ``check_registries=False`` skips the checks that need the algorithm/model/optimizer to be registered (for study
    files of methods that are not installed)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"study file {str(p)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"study file {str(p)!r}: cannot parse: {e}") from None
    try:
        return parse_study(data, source_path=p, check_registries=check_registries, overrides=overrides)
    except ConfigError as e:
        raise ConfigError(f"{e} [study file {p}]") from None
