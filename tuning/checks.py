"""A study's configs checked before any trial: every parameter path against the config (and the registries), and a
dry build of the config at both ends of every range and at every choice (:func:`check_config`)."""

from __future__ import annotations

from fedray.config import ConfigError, ExperimentConfig, from_dict
from fedray.config_paths import check_path
from fedray.plugins import check_params_key
from fedray.plugins import check_registries as _check_registries
from tuning.space import StudySpec


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
    dataclasses (and the registries: :func:`fedray.plugins.check_params_key`), and the config at both ends of
    every range / at every choice."""
    base_cfg = _build(spec.base_config, "base_config")
    if check_registries:
        _check_registries(base_cfg, "base_config")
        _check_eval_metric_objectives(spec, base_cfg)
    for p in spec.params:
        where = f"params.{p.path}"
        owner = check_path(p.path, where, ExperimentConfig, leaf=True, noun="parameter path")
        if owner is not None and check_registries:
            check_params_key(base_cfg, p.path, owner, where)
        for v in p.probe_values():
            cfg = _build(spec.config_with({p.path: v}), f"{where} = {v!r}")
            if check_registries:
                _check_registries(cfg, f"{where} = {v!r}")
    if len(spec.params) > 1:  # the corners where every range is at its low / high end together
        for end in (0, -1):
            where = f"params (all at their {'low' if end == 0 else 'high'} end)"
            cfg = _build(spec.config_with({p.path: p.probe_values()[end] for p in spec.params}), where)
            if check_registries:
                _check_registries(cfg, where)
