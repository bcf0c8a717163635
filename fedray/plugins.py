"""Checks of the plugin names a config uses, before any work (``fedray run``, ``fedray tune``, sweeps)."""

from __future__ import annotations

from fedray.algorithms import build_algorithm, build_server_optimizer
from fedray.config import ConfigError, ExperimentConfig
from fedray.data.sources import SOURCES
from fedray.models import MODELS

__all__ = ["check_registries"]


def check_registries(cfg: ExperimentConfig, where: str | None = None) -> None:
    """Algorithm and server optimizer (built, so their parameters are checked), model name and options,
    data source: a ConfigError naming the field (prefixed with ``where``, e.g. a study's file, if given)."""
    try:
        build_algorithm(cfg.algorithm.name, cfg.algorithm.params, cfg)
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
    except ConfigError as e:
        if where is None:
            raise
        raise ConfigError(f"{where}: {e}") from None
