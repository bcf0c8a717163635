"""Checks of the plugins a config uses, before any work (``fedray run``, ``fedray tune``, sweeps)."""

from __future__ import annotations

from fedray.algorithms import algorithm_of, build_server_optimizer
from fedray.config import ConfigError, ExperimentConfig
from fedray.data.loader import Augment
from fedray.data.sources import SOURCES
from fedray.data.table import DataError
from fedray.engine.programs.fold_group import check_fold_group
from fedray.models import MODELS, model_for_meta
from fedray.reporting.trackers import check_trackers

__all__ = ["check_model", "check_output_root", "check_registries"]


def check_registries(cfg: ExperimentConfig, where: str | None = None) -> None:
    """Algorithm and server optimizer (built, so their parameters are checked; ``engine.fold_group`` against
    the algorithm), model name and options,
    data source, the libraries of the trackers it turns on (``output.mlflow`` / ``output.wandb``): a
    ConfigError naming the field (prefixed with ``where``, e.g. a study's file, if given)."""
    try:
        check_fold_group(cfg, algorithm_of(cfg))  # partial sums on the workers: refused for incompatible algorithms
        build_server_optimizer(cfg.server.name, cfg.server.lr, cfg.server.params)
        if cfg.model.name not in MODELS:
            raise ConfigError(f"model.name: unknown model {cfg.model.name!r} (known: {', '.join(sorted(MODELS))})")
        opts = MODELS[cfg.model.name].options
        bad = sorted(set(cfg.model.params) - set(opts))
        if bad:
            raise ConfigError(f"model.params.{bad[0]}: unknown option of model {cfg.model.name!r} "
                              f"(known: {', '.join(sorted(opts))})")
        if cfg.data.source not in SOURCES:
            raise ConfigError(f"data.source: unknown source {cfg.data.source!r} (known: {', '.join(sorted(SOURCES))})")
        try:
            Augment.from_spec(cfg.train.augment)
        except DataError as e:
            raise ConfigError(f"train.{e}") from None
        check_trackers(cfg)
    except ConfigError as e:
        if where is None:
            raise
        raise ConfigError(f"{where}: {e}") from None


def check_model(cfg: ExperimentConfig, meta) -> None:
    """Build the model once for the data's shape, so a bad option value fails before any work, naming
    ``model.params`` (the builders raise ValueError)."""
    try:
        model_for_meta(cfg.model.name, meta, **cfg.model.params)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"model.params: {e}") from None


def check_output_root(cfg: ExperimentConfig) -> None:
    """``output.root`` (and ``data.cache_dir``) must be directories this process can create and write."""
    import os
    from pathlib import Path

    for name, value in (("output.root", cfg.output.root), ("data.cache_dir", cfg.data.cache_dir)):
        if not value:
            continue
        path = Path(value)
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"{name}: cannot create {str(path)!r} ({e.strerror or e})") from None
        if not path.is_dir() or not os.access(path, os.W_OK | os.X_OK):
            raise ConfigError(f"{name}: {str(path)!r} is not a writable directory")
