"""A study as data: the search space (one :class:`SearchParam` per dotted config path), the objectives, the
sampler, pruner, budget and trial resources (:class:`StudySpec`). :mod:`tuning.study` builds one from a study file.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass, field

from fedray.config import ConfigError
from fedray.config_paths import set_path

#: the parent of the study directories when neither ``--output-dir`` nor the study file's ``output_dir`` names one
DEFAULT_OUTPUT_DIR = "runs/studies"


@dataclass(frozen=True)
class SearchParam:
    """One dimension of the search space: a dotted config path and its distribution."""

    path: str
    kind: str  # float | int | categorical
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    step: float | int | None = None
    choices: tuple = ()

    @classmethod
    def parse(cls, path: str, raw) -> "SearchParam":
        """The parameter ``params.<path>`` of a study file: ``type``, ``low``/``high``, ``log``, ``step``, ``choices``."""
        where = f"params.{path}"
        if not isinstance(path, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*", path):
            raise ConfigError(f"params.{path}: a parameter must be a dotted config path such as algorithm.params.mu")
        raw = as_mapping(raw, where, ("type", "low", "high", "log", "step", "choices"))
        if not raw:
            raise ConfigError(f"{where}: empty specification (give type and low/high, or choices)")
        kind = raw.get("type", "categorical" if "choices" in raw else None)
        if kind not in ("float", "int", "categorical"):
            raise ConfigError(f"{where}.type: must be float, int or categorical, got {kind!r}")
        if kind == "categorical":
            return cls(path, "categorical", choices=_choices(raw, where))
        if "choices" in raw:
            raise ConfigError(f"{where}.choices: only for type: categorical")
        for k in ("low", "high"):
            if k not in raw:
                raise ConfigError(f"{where}.{k}: required for a {kind} range")
        if kind == "int":
            low, high = as_int(raw["low"], f"{where}.low"), as_int(raw["high"], f"{where}.high")
        else:
            low, high = as_number(raw["low"], f"{where}.low"), as_number(raw["high"], f"{where}.high")
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
            step = (as_int(step, f"{where}.step", 1) if kind == "int"
                    else as_number(step, f"{where}.step", 0.0, strict=True))
            if step > high - low:
                raise ConfigError(f"{where}.step: {step} is larger than the range [{low}, {high}]")
        return cls(path, kind, low=low, high=high, log=log, step=step)

    def check_value(self, v, where: str) -> None:
        """``v`` is a value of this parameter (an ``enqueue:`` point)."""
        if self.kind == "categorical":
            if v not in self.choices:
                raise ConfigError(f"{where}: {v!r} is not one of the choices {list(self.choices)}")
            return
        if not is_number(v) or (self.kind == "int" and not isinstance(v, int)):
            raise ConfigError(f"{where}: expected {'an integer' if self.kind == 'int' else 'a number'}, got {v!r}")
        if not self.low <= v <= self.high:
            raise ConfigError(f"{where}: {v!r} is outside [{self.low}, {self.high}]")

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


def as_mapping(value, where: str, allowed: tuple | dict | list | None = None) -> dict:
    """``value`` as a mapping of a study file (None: empty), its keys among ``allowed``."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__} {value!r}")
    if allowed is not None:
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            raise ConfigError(f"{where}.{unknown[0]}: unknown key (known: {', '.join(sorted(allowed)) or 'none'})")
    return value


def is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def as_int(value, where: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{where}: must be >= {minimum}, got {value!r}")
    return value


def as_number(value, where: str, minimum: float | None = None, strict: bool = False) -> float:
    if not is_number(value) or (isinstance(value, float) and not math.isfinite(value)):
        raise ConfigError(f"{where}: expected a finite number, got {value!r}")
    if minimum is not None and (value <= minimum if strict else value < minimum):
        raise ConfigError(f"{where}: must be {'>' if strict else '>='} {minimum}, got {value!r}")
    return float(value)


def _choices(raw: dict, where: str) -> tuple:
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
    return tuple(choices)


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
    base_config: dict  # the base experiment config as a mapping (base_overrides and command-line overrides applied)
    params: list[SearchParam]
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
    overrides: list[str] = field(default_factory=list)  # the command line's a.b=c of the base config

    @property
    def directions(self) -> list[str]:
        return [o.direction for o in self.objectives]

    @property
    def pruning(self) -> bool:
        return not self.multi_objective and self.pruner.name != "none"

    def param(self, path: str) -> SearchParam:
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

    def grid_size(self) -> int | None:
        """The number of points of the grid sampler's grid (None for the other samplers)."""
        if self.sampler.name != "grid":
            return None
        return math.prod(len(p.grid_values()) for p in self.params)
