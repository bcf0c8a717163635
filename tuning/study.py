"""A study as data: the YAML study file, parsed and checked before any trial runs.

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

Objective metrics: ``accuracy`` (last evaluated), ``ema_accuracy`` (last EMA accuracy), ``mean_last5``
(mean of the last five evaluated accuracies), ``bytes_total`` (bytes broadcast + uploaded over the
run) or any key of the per-round metrics, dotted for nested ones (``loss``, ``bytes.upload``,
``seconds.train``, ``domain_accuracy.mnist``, a metric of the base config's ``eval.metrics`` such as
``balanced_accuracy`` or ``per_class_accuracy.3``, ...): its value at the last round that has it. The value
reported to the pruner after each round is the same quantity computed on the rounds so far.

:func:`load_study` raises :class:`fedray.config.ConfigError` with the dotted name of the offending field
(``params.train.lrr: ...``, ``sampler.name: ...``) for every mistake it can see: unknown keys, unknown
parameter paths (checked against the config dataclasses and the registries of algorithms, server
optimizers, models and partitioners through a dry build of the config at the ends of every range and
at every choice), empty or invalid ranges, unknown samplers and pruners, a missing base config.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from fedray.config import ConfigError, ExperimentConfig, anchor_to_file, apply_overrides, from_dict, read_config_file

#: metrics computed by the runner from the whole run (anything else is a per-round key)
DERIVED_METRICS = ("accuracy", "ema_accuracy", "mean_last5", "bytes_total")
_MAXIMIZE_BY_DEFAULT = ("accuracy", "ema_accuracy", "mean_last5")
_MINIMIZE_BY_DEFAULT = ("bytes_total", "loss")

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


# --------------------------------------------------------------------------------------------- specs
@dataclass(frozen=True)
class ParamSpec:
    """One dimension of the search space: a dotted config path and its distribution."""

    path: str
    kind: str  # float | int | categorical
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple = ()

    def distribution(self):
        """The Optuna distribution of this parameter."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind == "float":
            return FloatDistribution(float(self.low), float(self.high), log=self.log,
                                     step=None if self.step is None else float(self.step))
        if self.kind == "int":
            return IntDistribution(int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return CategoricalDistribution(list(self.choices))

    def grid_values(self) -> list:
        """Every value the grid sampler visits (needs choices, an int range or a float step)."""
        if self.kind == "categorical":
            return list(self.choices)
        if self.kind == "int":
            if self.log:
                raise ConfigError(f"params.{self.path}: the grid sampler cannot enumerate a log int range; "
                                  f"use type: categorical with choices")
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        if self.step is None:
            raise ConfigError(f"params.{self.path}: the grid sampler needs `step` for a float range "
                              f"(or type: categorical with choices)")
        n = int(math.floor((float(self.high) - float(self.low)) / float(self.step) + 1e-9))
        return [round(float(self.low) + i * float(self.step), 12) for i in range(n + 1)]

    def probe_values(self) -> list:
        """Values used by the dry config build: both ends of a range, or every choice."""
        if self.kind == "categorical":
            return list(self.choices)
        return [self.low, self.high]

    def describe(self) -> str:
        if self.kind == "categorical":
            return f"one of {list(self.choices)}"
        extra = " (log)" if self.log else (f" step {self.step}" if self.step is not None else "")
        return f"{self.kind} in [{self.low}, {self.high}]{extra}"


@dataclass(frozen=True)
class Objective:
    metric: str
    direction: str  # maximize | minimize


@dataclass(frozen=True)
class SamplerSpec:
    name: str = "tpe"
    seed: int = 0
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class PrunerSpec:
    name: str = "hyperband"
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class TrialResources:
    """The slice of the cluster one trial gets: its client-worker pool (``engine.num_workers`` etc.).

    ``None`` means "take the base config's engine value": ``engine.num_workers`` (1 when unset),
    ``engine.worker_num_cpus``, ``engine.worker_num_gpus`` (when unset: 1/``engine.workers_per_gpu`` per
    worker if the cluster has GPUs, else 0)."""

    workers: int | None = None
    cpus_per_worker: float | None = None
    gpus_per_worker: float | None = None


@dataclass
class StudySpec:
    """A parsed, validated study file."""

    name: str
    base_config: dict  # the base experiment config as a mapping (base_overrides applied)
    params: list[ParamSpec]
    objectives: list[Objective]
    multi_objective: bool = False
    n_trials: int = 20
    timeout_s: float | None = None
    max_consecutive_failures: int = 3
    sampler: SamplerSpec = field(default_factory=SamplerSpec)
    pruner: PrunerSpec = field(default_factory=PrunerSpec)
    storage: str | None = None
    concurrency: int = 1
    trial_resources: TrialResources = field(default_factory=TrialResources)
    output_dir: str | None = None
    enqueue: list[dict] = field(default_factory=list)
    description: str = ""
    source_path: str | None = None
    base_config_path: str | None = None

    @property
    def directions(self) -> list[str]:
        return [o.direction for o in self.objectives]

    @property
    def pruning(self) -> bool:
        return not self.multi_objective and self.pruner.name != "none"

    def param(self, path: str) -> ParamSpec:
        for p in self.params:
            if p.path == path:
                return p
        raise KeyError(path)

    def distributions(self) -> dict:
        return {p.path: p.distribution() for p in self.params}

    def config_with(self, values: dict) -> dict:
        """The base config mapping with ``values`` ({dotted path: value}) set."""
        data = copy.deepcopy(self.base_config)
        for path, value in values.items():
            set_path(data, path, value, where=f"params.{path}")
        return data

    def identity(self) -> dict:
        """What must not change when a study is resumed: search space and objectives."""
        return {
            "params": [dataclasses.asdict(p) | {"choices": list(p.choices)} for p in self.params],
            "objectives": [dataclasses.asdict(o) for o in self.objectives],
        }

    def identity_hash(self) -> str:
        blob = json.dumps(self.identity(), sort_keys=True, default=str).encode()
        return hashlib.sha256(blob).hexdigest()[:12]

    def max_rounds(self) -> int:
        """The number of FL rounds of the longest trial (the pruners' maximum resource)."""
        rounds = int((self.base_config.get("train") or {}).get("rounds", 10))
        for p in self.params:
            if p.path == "train.rounds":
                rounds = max(int(v) for v in (p.choices if p.kind == "categorical" else (p.low, p.high)))
        return rounds


# ------------------------------------------------------------------------------------------ helpers
def set_path(data: dict, path: str, value: Any, *, where: str) -> dict:
    """Set ``data[a][b][c] = value`` for ``path = "a.b.c"``, creating mappings on the way."""
    parts = path.split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"{where}: {'.'.join(parts[: i + 1])} is {nxt!r}, cannot set {path}")
        node = nxt
    node[parts[-1]] = value
    return data


def _mapping(value, where: str, allowed: tuple | dict | None = None) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__} {value!r}")
    if allowed is not None:
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(sorted(allowed)) or 'none'})")
    return value


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(value, where: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{where}: must be >= {minimum}, got {value!r}")
    return value


def _number(value, where: str, minimum: float | None = None, strict: bool = False) -> float:
    if not _is_number(value) or (isinstance(value, float) and not math.isfinite(value)):
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    if minimum is not None and (value <= minimum if strict else value < minimum):
        raise ConfigError(f"{where}: must be {'>' if strict else '>='} {minimum}, got {value!r}")
    return float(value)


def _typed(value, typ, where: str):
    if typ is int:
        return _int(value, where, 0)
    if typ is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    return value


# --------------------------------------------------------------------------------------- parsing
def _parse_param(path: str, raw) -> ParamSpec:
    where = f"params.{path}"
    if not isinstance(path, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", path):
        raise ConfigError(f"params.{path}: a parameter must be a dotted config path such as algorithm.params.mu")
    raw = _mapping(raw, where, ("type", "low", "high", "log", "step", "choices"))
    if not raw:
        raise ConfigError(f"{where}: empty specification (give type and low/high, or choices)")
    kind = raw.get("type", "categorical" if "choices" in raw else None)
    if kind not in ("float", "int", "categorical"):
        raise ConfigError(f"{where}.type: must be float, int or categorical, got {kind!r}")
    if kind == "categorical":
        extra = sorted(set(raw) - {"type", "choices"})
        if extra:
            raise ConfigError(f"{where}.{extra[0]}: not allowed for a categorical parameter (use choices)")
        choices = raw.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"{where}.choices: expected a non-empty list, got {choices!r}")
        for c in choices:
            if c is not None and not isinstance(c, (str, int, float, bool)):
                raise ConfigError(f"{where}.choices: every choice must be a string, number, boolean or null; got {c!r}")
        if len({json.dumps(c) for c in choices}) != len(choices):
            raise ConfigError(f"{where}.choices: duplicate choices in {choices!r}")
        return ParamSpec(path, "categorical", choices=tuple(choices))
    if "choices" in raw:
        raise ConfigError(f"{where}.choices: only for type: categorical")
    for k in ("low", "high"):
        if k not in raw:
            raise ConfigError(f"{where}.{k}: required for a {kind} range")
    if kind == "int":
        low, high = _int(raw["low"], f"{where}.low"), _int(raw["high"], f"{where}.high")
    else:
        low, high = _number(raw["low"], f"{where}.low"), _number(raw["high"], f"{where}.high")
    if not low < high:
        raise ConfigError(f"{where}: empty range, low ({low}) must be < high ({high})")
    log = raw.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"{where}.log: expected true/false, got {log!r}")
    if log and low <= 0:
        raise ConfigError(f"{where}.low: must be > 0 for a log range, got {low}")
    step = raw.get("step")
    if step is not None:
        if log:
            raise ConfigError(f"{where}.step: cannot be combined with log: true")
        step = _int(step, f"{where}.step", 1) if kind == "int" else _number(step, f"{where}.step", 0.0, strict=True)
        if step > high - low:
            raise ConfigError(f"{where}.step: {step} is larger than the range [{low}, {high}]")
    return ParamSpec(path, kind, low=low, high=high, log=log, step=step)


def _parse_objective(raw, where: str) -> Objective:
    raw = _mapping(raw, where, ("metric", "direction"))
    metric = raw.get("metric", "ema_accuracy")
    if not isinstance(metric, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z0-9_-]+)*", metric):
        raise ConfigError(f"{where}.metric: expected one of {', '.join(DERIVED_METRICS)} or a (dotted) round "
                          f"metric key such as loss or bytes.upload, got {metric!r}")
    direction = raw.get("direction")
    if direction is None:
        if metric in _MAXIMIZE_BY_DEFAULT:
            direction = "maximize"
        elif metric in _MINIMIZE_BY_DEFAULT:
            direction = "minimize"
        else:
            raise ConfigError(f"{where}.direction: required for metric {metric!r} (maximize or minimize)")
    if direction not in ("maximize", "minimize"):
        raise ConfigError(f"{where}.direction: must be maximize or minimize, got {direction!r}")
    return Objective(metric, direction)


def _parse_named(raw, where: str, table: dict, default: str) -> tuple[str, dict]:
    if raw is None:
        return default, {}
    if isinstance(raw, str):
        raw = {"name": raw}
    raw = _mapping(raw, where)
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
    cands = []
    p = Path(os.path.expanduser(raw))
    if p.is_absolute():
        cands = [p]
    else:
        if study_dir is not None:
            cands.append(study_dir / p)
        cands.append(Path.cwd() / p)
    for c in cands:
        if c.is_file():
            try:
                data = read_config_file(c)
            except ConfigError as e:
                raise ConfigError(f"base_config: {e}") from None
            return anchor_to_file(data, c), str(c.resolve())
    raise ConfigError(f"base_config: file {raw!r} not found (looked in {', '.join(str(c) for c in cands)})")


def parse_study(data: dict, *, source_path: str | Path | None = None, check_registries: bool = True) -> StudySpec:
    """Build and validate a :class:`StudySpec` from a study mapping (see the module docstring)."""
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

    base, base_path = _load_base(data.get("base_config"), study_dir)
    ovs = data.get("base_overrides") or []
    if not isinstance(ovs, list) or not all(isinstance(o, str) for o in ovs):
        raise ConfigError(f"base_overrides: expected a list of 'a.b=c' strings, got {ovs!r}")
    try:
        base = apply_overrides(base, ovs)
    except ConfigError as e:
        raise ConfigError(f"base_overrides: {e}") from None

    # sampler before params: the grid sampler needs enumerable parameters
    s_name, s_opts = _parse_named(data.get("sampler"), "sampler", SAMPLERS, "tpe")
    seed = s_opts.pop("seed", 0)
    sampler = SamplerSpec(s_name, seed, s_opts)

    raw_params = data.get("params")
    if not isinstance(raw_params, dict) or not raw_params:
        raise ConfigError("params: expected a non-empty mapping of dotted config paths to ranges, "
                          "e.g. {algorithm.params.mu: {type: float, low: 1.0e-4, high: 1, log: true}}")
    params = [_parse_param(path, spec) for path, spec in raw_params.items()]
    if s_name == "grid":
        for p in params:
            p.grid_values()

    if data.get("multi_objective") is not None:
        if data.get("objective") is not None:
            raise ConfigError("multi_objective: give either objective or multi_objective, not both")
        mo = data["multi_objective"]
        if not isinstance(mo, list) or len(mo) < 2:
            raise ConfigError(f"multi_objective: expected a list of at least two {{metric, direction}} mappings, got {mo!r}")
        objectives = [_parse_objective(o, f"multi_objective[{i}]") for i, o in enumerate(mo)]
        if len({o.metric for o in objectives}) != len(objectives):
            raise ConfigError("multi_objective: the same metric appears twice")
        multi = True
    else:
        objectives = [_parse_objective(data.get("objective") or {}, "objective")]
        multi = False

    p_default = "none" if multi else "hyperband"
    p_name, p_opts = _parse_named(data.get("pruner"), "pruner", PRUNERS, p_default)
    if multi and p_name != "none":
        raise ConfigError(f"pruner.name: {p_name!r} cannot be used with multi_objective (Optuna does not prune "
                          f"multi-objective trials); use none")
    pruner = PrunerSpec(p_name, p_opts)

    budget = _mapping(data.get("budget"), "budget", ("n_trials", "timeout_s", "max_consecutive_failures"))
    n_trials = _int(budget.get("n_trials", 20), "budget.n_trials", 1)
    timeout = budget.get("timeout_s")
    if timeout is not None:
        timeout = _number(timeout, "budget.timeout_s", 0.0, strict=True)
    mcf = _int(budget.get("max_consecutive_failures", 3), "budget.max_consecutive_failures", 1)

    storage = data.get("storage")
    if storage is not None and (not isinstance(storage, str) or not storage.strip()):
        raise ConfigError(f"storage: expected a URL (postgresql://...) or a journal file path, got {storage!r}")
    concurrency = _int(data.get("concurrency", 1), "concurrency", 1)
    tr = _mapping(data.get("trial_resources"), "trial_resources", ("workers", "cpus_per_worker", "gpus_per_worker"))
    res = TrialResources(
        workers=None if tr.get("workers") is None else _int(tr["workers"], "trial_resources.workers", 1),
        cpus_per_worker=None if tr.get("cpus_per_worker") is None else _number(tr["cpus_per_worker"], "trial_resources.cpus_per_worker", 0.0),
        gpus_per_worker=None if tr.get("gpus_per_worker") is None else _number(tr["gpus_per_worker"], "trial_resources.gpus_per_worker", 0.0),
    )
    out = data.get("output_dir")
    if out is not None and (not isinstance(out, str) or not out.strip()):
        raise ConfigError(f"output_dir: expected a directory path, got {out!r}")

    spec = StudySpec(name=name, base_config=base, params=params, objectives=objectives, multi_objective=multi,
                     n_trials=n_trials, timeout_s=timeout, max_consecutive_failures=mcf, sampler=sampler,
                     pruner=pruner, storage=storage, concurrency=concurrency, trial_resources=res,
                     output_dir=out, description=description,
                     source_path=str(Path(source_path).resolve()) if source_path else None,
                     base_config_path=base_path)

    enq = data.get("enqueue") or []
    if not isinstance(enq, list):
        raise ConfigError(f"enqueue: expected a list of {{param path: value}} mappings, got {enq!r}")
    for i, point in enumerate(enq):
        point = _mapping(point, f"enqueue[{i}]", [p.path for p in params])
        for path, v in point.items():
            _check_in_distribution(spec.param(path), v, f"enqueue[{i}].{path}")
        spec.enqueue.append(dict(point))
    if spec.pruning and p_name == "hyperband":
        mr = p_opts.get("max_resource", spec.max_rounds())
        if p_opts.get("min_resource", 1) < 1 or p_opts.get("min_resource", 1) > mr:
            raise ConfigError(f"pruner.min_resource: must be in [1, {mr}] (the number of rounds), "
                              f"got {p_opts.get('min_resource')!r}")
        if p_opts.get("reduction_factor", 3) < 2:
            raise ConfigError(f"pruner.reduction_factor: must be >= 2, got {p_opts['reduction_factor']!r}")

    check_config(spec, check_registries=check_registries)
    return spec


def _check_in_distribution(p: ParamSpec, v, where: str) -> None:
    if p.kind == "categorical":
        if v not in p.choices:
            raise ConfigError(f"{where}: {v!r} is not one of the choices {list(p.choices)}")
        return
    if not _is_number(v) or (p.kind == "int" and not isinstance(v, int)):
        raise ConfigError(f"{where}: expected {'an integer' if p.kind == 'int' else 'a number'}, got {v!r}")
    if not p.low <= v <= p.high:
        raise ConfigError(f"{where}: {v!r} is outside [{p.low}, {p.high}]")


def load_study(path: str | Path, *, check_registries: bool = True) -> StudySpec:
    """Read and validate a study YAML file. ``check_registries=False`` skips the checks that need the
    algorithm/model/optimizer to be registered (for study files of methods that are not installed)."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"study file {str(p)!r} does not exist")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"study file {str(p)!r}: cannot parse: {e}") from None
    try:
        return parse_study(data, source_path=p, check_registries=check_registries)
    except ConfigError as e:
        raise ConfigError(f"{e} [study file {p}]") from None


# --------------------------------------------------------------------------- dry config build
def _dataclass_hint(cls, name):
    return typing.get_type_hints(cls).get(name)


def _path_target(path: str) -> tuple[str, str | None]:
    """Check ``path`` against the config dataclasses. Returns (kind, free_key_owner): kind is "field"
    for a typed field, "free" for a key inside a free-form ``params`` mapping (owner = the dotted
    mapping, e.g. ``algorithm.params``). Raises ConfigError for paths that do not exist."""
    parts = path.split(".")
    cls = ExperimentConfig
    for i, part in enumerate(parts):
        names = [f.name for f in dataclasses.fields(cls) if f.name != "source_path"]
        here = ".".join(parts[:i]) or "config"
        if part not in names:
            raise ConfigError(f"params.{path}: unknown parameter path: {part!r} is not a field of {here} "
                              f"(known: {', '.join(names)})")
        hint = _dataclass_hint(cls, part)
        if dataclasses.is_dataclass(hint):
            if i == len(parts) - 1:
                raise ConfigError(f"params.{path}: is a whole section; name one of its fields "
                                  f"({', '.join(f.name for f in dataclasses.fields(hint))})")
            cls = hint
            continue
        if typing.get_origin(hint) is dict:
            if i == len(parts) - 1:
                raise ConfigError(f"params.{path}: is a mapping; name one of its keys, e.g. {path}.<key>")
            return "free", ".".join(parts[: i + 1])
        if i != len(parts) - 1:
            raise ConfigError(f"params.{path}: {'.'.join(parts[: i + 1])} is a single value, it has no field "
                              f"{parts[i + 1]!r}")
        return "field", None
    return "field", None


def _check_free_key(path: str, owner: str, cfg: ExperimentConfig) -> None:
    """Is the key of a free ``params`` mapping known to the registry entry it configures?"""
    key = path[len(owner) + 1:].split(".")[0]
    known: list[str] | None = None
    what = ""
    if owner == "algorithm.params":
        from fedray.algorithms import ALGORITHMS

        cls = ALGORITHMS.get(cfg.algorithm.name)
        if cls is None:
            raise ConfigError(f"algorithm.name: unknown algorithm {cfg.algorithm.name!r} (known: {', '.join(sorted(ALGORITHMS))})")
        known, what = list(cls.params_spec), f"algorithm {cfg.algorithm.name!r}"
    elif owner == "server.params":
        from fedray.algorithms import SERVER_OPTIMIZERS

        cls = SERVER_OPTIMIZERS.get(cfg.server.name)
        if cls is None:
            raise ConfigError(f"server.name: unknown server optimizer {cfg.server.name!r}")
        known, what = list(cls.params_spec), f"server optimizer {cfg.server.name!r}"
    elif owner == "model.params":
        from fedray.models import MODELS

        spec = MODELS.get(cfg.model.name)
        if spec is None:
            raise ConfigError(f"model.name: unknown model {cfg.model.name!r} (known: {', '.join(sorted(MODELS))})")
        known, what = list(spec.options), f"model {cfg.model.name!r}"
    elif owner == "data.partition.params":
        from fedray.data.partition import PARTITIONERS

        spec = PARTITIONERS.get(cfg.data.partition.name)
        if spec is None:
            raise ConfigError(f"data.partition.name: unknown partitioner {cfg.data.partition.name!r}")
        known, what = list(spec.params), f"partitioner {cfg.data.partition.name!r}"
    if known is not None and key not in known:
        raise ConfigError(f"params.{path}: unknown parameter path: {what} has no parameter {key!r} "
                          f"(known: {', '.join(sorted(known)) or 'none'})")


def _build(data: dict, where: str) -> ExperimentConfig:
    try:
        return from_dict(data)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def _check_eval_metric_objectives(spec: StudySpec, base_cfg: ExperimentConfig) -> None:
    """An objective naming a registered evaluation metric (``balanced_accuracy``, ``per_class_accuracy.3``; the
    config's plugins are imported by now) needs it in the base config's ``eval.metrics``: no trial would report it."""
    from fedray.metrics.registry import METRICS

    for i, o in enumerate(spec.objectives):
        name = o.metric.split(".")[0]
        if name in METRICS and name not in base_cfg.eval.metrics and all(p.path != "eval.metrics" for p in spec.params):
            where = f"multi_objective[{i}]" if spec.multi_objective else "objective"
            raise ConfigError(f"{where}.metric: {o.metric!r} is an evaluation metric that the base config does not "
                              f"compute; add eval.metrics: [{name}] to it (or base_overrides: "
                              f"['eval.metrics=[{name}]'])")


def check_config(spec: StudySpec, *, check_registries: bool = True) -> None:
    """Dry-build the experiment config: the base config alone, every parameter path against the config
    dataclasses (and registries), and the config at both ends of every range / at every choice."""
    from fedray.plugins import check_registries as _check_registries  # the registries import torch: not at import

    base_cfg = _build(spec.base_config, "base_config")
    if check_registries:
        _check_registries(base_cfg, "base_config")
        _check_eval_metric_objectives(spec, base_cfg)
    for p in spec.params:
        kind, owner = _path_target(p.path)
        if kind == "free" and check_registries:
            _check_free_key(p.path, owner, base_cfg)
        for v in p.probe_values():
            where = f"params.{p.path}"
            data = spec.config_with({p.path: v})
            cfg = _build(data, f"{where} = {v!r}")
            if check_registries:
                _check_registries(cfg, f"{where} = {v!r}")
    if len(spec.params) > 1:  # the corners where every range is at its low / high end together
        for end in (0, -1):
            values = {p.path: p.probe_values()[end] for p in spec.params}
            cfg = _build(spec.config_with(values), f"params (all at their {'low' if end == 0 else 'high'} end)")
            if check_registries:
                _check_registries(cfg, f"params (all at their {'low' if end == 0 else 'high'} end)")
