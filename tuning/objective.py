"""A study's objective: which metric, which direction (from the study file), and its value computed from a trial's
round reports, after every round (for the pruner) and at the end (for Optuna's ``tell``).

Metrics: ``accuracy`` (last evaluated), ``ema_accuracy`` (last EMA accuracy), ``mean_last5`` (mean of the last five
evaluated accuracies), ``bytes_total`` (bytes broadcast + uploaded over the run) or any key of the per-round
metrics, dotted for nested ones (``loss``, ``bytes.upload``, ``seconds.train``, ``domain_accuracy.mnist``, a metric
of the base config's ``eval.metrics`` such as ``balanced_accuracy`` or ``per_class_accuracy.3``, ...): its value at
the last round that has it.
"""

from __future__ import annotations

import re

from fedray.config import ConfigError, ExperimentConfig
from fedray.config_paths import get_path
from tuning.space import Objective

#: metrics computed by the tracker from the whole run (anything else is a per-round key)
DERIVED_METRICS = ("accuracy", "ema_accuracy", "mean_last5", "bytes_total")
_MAXIMIZE_BY_DEFAULT = ("accuracy", "ema_accuracy", "mean_last5")
_MINIMIZE_BY_DEFAULT = ("bytes_total", "loss")


class MetricError(RuntimeError):
    """The objective metric is not produced by the runs (a study-level mistake: the study stops)."""


def parse_objective(raw, where: str) -> Objective:
    """``{metric, direction}`` of a study file (``direction`` defaults by metric where it can)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, got {type(raw).__name__} {raw!r}")
    unknown = sorted(set(raw) - {"metric", "direction"})
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown key (known: direction, metric)")
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


class MetricTracker:
    """Computes the objective values from the per-round metric rows of one run."""

    def __init__(self, metrics: list[str]):
        self.metrics = list(metrics)
        self.accuracies: list[float] = []
        self.bytes_total = 0
        self.last: dict[str, float] = {}
        self.fresh: dict[str, bool] = {}

    def update(self, report: dict) -> None:
        acc = report.get("accuracy")
        if acc is not None:
            self.accuracies.append(float(acc))
        b = report.get("bytes") or {}
        self.bytes_total += int(b.get("broadcast", 0)) + int(b.get("upload", 0))
        for m in self.metrics:
            v = self._value(m, report)
            self.fresh[m] = v is not None
            if v is not None:
                self.last[m] = v

    def _value(self, metric: str, report: dict) -> float | None:
        if metric == "mean_last5":
            if report.get("accuracy") is None:
                return None
            tail = self.accuracies[-5:]
            return float(sum(tail) / len(tail))
        if metric == "bytes_total":
            return float(self.bytes_total)
        v = get_path(report, metric)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise MetricError(f"objective.metric: {metric!r} is not a number in the round metrics (got {v!r})")
        return float(v)

    def check_present(self, report: dict, cfg: ExperimentConfig) -> None:
        """On a round where every key is present (an evaluation round that is also an analysis round
        when analysis is on), a round-key metric that is still missing will never appear."""
        if report.get("accuracy") is None:
            return
        ana = int(cfg.eval.analysis_every)
        if ana and int(report["round"]) % ana != 0 and int(report["round"]) != int(cfg.train.rounds):
            return
        for m in self.metrics:
            if m not in DERIVED_METRICS and m not in self.last:
                keys = sorted(k for k in report if k != "ledger")
                raise MetricError(f"objective.metric: {m!r} is not in the round metrics (keys: {', '.join(keys)}; "
                                  f"or one of {', '.join(DERIVED_METRICS)})")

    def intermediate(self) -> float | None:
        """The first objective's value after this round, if this round produced one."""
        m = self.metrics[0]
        return self.last.get(m) if self.fresh.get(m) else None

    def final(self) -> list[float]:
        missing = [m for m in self.metrics if m not in self.last]
        if missing:
            raise MetricError(f"objective.metric: {missing[0]!r} was never produced by the run")
        return [self.last[m] for m in self.metrics]
