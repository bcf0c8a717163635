"""Checks of the plugins a config uses, before any work (``fedray run``, ``fedray tune``, sweeps).

The registries (algorithms, models, augmentations) import torch, so they are imported where they are checked:
a Ray run's driver imports none of them and has its coordinator actor run :func:`check_run` instead
(:meth:`fedray.driver.launch.EarlyStart.check`)."""

from __future__ import annotations

from fedray.config import ConfigError, ExperimentConfig

__all__ = ["check_data_fit", "check_driver", "check_model", "check_output_root", "check_params_key", "check_plugins",
           "check_registries", "check_run", "load_plugins", "plugin_py_modules"]


def load_plugins(cfg: ExperimentConfig) -> list[str]:
    """Import the config's ``plugins`` in this process (once; :func:`fedray.core.plugin_loader.load`), checking
    that the code imported is the code the config's ``plugin_code`` records. The module names."""
    if not cfg.plugins:
        return []
    from fedray.core.plugin_loader import load

    return load(cfg.plugins, cfg.plugin_code, cfg.plugin_roots)


def driver_only_hint(cfg: ExperimentConfig) -> str:
    """For an error of the actors' registry checks: the names of ``cfg`` that this process has registered from a
    module the config's ``plugins`` do not name (a script that imported its method before calling fedray: the
    actors never import that module), as a hint to add it; "" when there is none. Looks only at registries this
    process imported already (a Ray driver imports none of its own accord)."""
    import sys

    from fedray.core import registry

    fields = {"algorithm": cfg.algorithm.name, "model": cfg.model.name, "data source": cfg.data.source,
              "partitioner": cfg.data.partition.name, "server optimizer": cfg.server.name}
    named = {m.split(".")[0] for m in [*cfg.plugin_code, *cfg.plugins]}
    hints = []
    for kind, name in fields.items():
        reg = registry.ALL.get(kind)
        if reg is None or name not in reg:
            continue
        module = reg.module(name)
        if module == "__main__":
            hints.append(f"{kind} {name!r} is defined in this script or notebook (__main__), which the run's actors "
                         f"cannot import: move it into a module file next to it and name that in `plugins:`")
        elif not registry.is_builtin(module) and module.split(".")[0] not in named and module in sys.modules:
            hints.append(f"{kind} {name!r} is registered in this process by module {module}, which the run's actors "
                         f"do not import: add `plugins: [{module.split('.')[0]}]` to the config")
    return "".join(f"\n  hint: {h}" for h in hints)


def plugin_py_modules(cfg: ExperimentConfig) -> list[str]:
    """What a run joining a Ray cluster by address ships of its plugins (:func:`fedray.core.plugin_loader.py_modules`)."""
    if not cfg.plugins:
        return []
    from fedray.core.plugin_loader import py_modules

    return py_modules(cfg.plugins, cfg.plugin_code, cfg.plugin_roots)


def check_registries(cfg: ExperimentConfig, where: str | None = None) -> None:
    """Algorithm and server optimizer (built, so their parameters are checked; ``engine.fold_group`` against
    the algorithm), model name and options, augmentations (:func:`check_plugins`), data source and the
    libraries of the trackers it turns on (:func:`check_driver`): a ConfigError naming the field (prefixed
    with ``where``, e.g. a study's file, if given)."""
    try:
        check_driver(cfg)
        check_plugins(cfg)
    except ConfigError as e:
        if where is None:
            raise
        raise ConfigError(f"{where}: {e}") from None


def check_driver(cfg: ExperimentConfig) -> None:
    """What the driver itself needs, without torch: a known data source (it loads the data; with ``data.download``
    one fedray can fetch) and the libraries of the trackers it writes to (``output.mlflow`` / ``output.wandb``). The
    config's plugins are imported here only when the data source or the partitioner is not a built-in (they run in
    the driver; a Ray run's driver imports no other plugin code)."""
    from fedray.core.registry import is_builtin
    from fedray.data.partition import PARTITIONERS
    from fedray.data.sources import SOURCES
    from fedray.reporting.trackers import check_trackers

    builtin = [(SOURCES, cfg.data.source), (PARTITIONERS, cfg.data.partition.name)]
    if cfg.plugins and not all(name in reg and is_builtin(reg.module(name)) for reg, name in builtin):
        load_plugins(cfg)  # a data source or partitioner of the user's: the driver runs it (prepare_data)
    if cfg.data.source not in SOURCES:
        raise ConfigError(f"data.source: unknown source {cfg.data.source!r} (known: {', '.join(sorted(SOURCES))})")
    if cfg.data.download or cfg.data.mirrors:  # a source fedray can fetch, http(s) mirrors (no network here)
        from fedray.data.fetch import check_download

        check_download(cfg.data)
    check_trackers(cfg)


def check_plugins(cfg: ExperimentConfig) -> None:
    """The registries' part of :func:`check_registries` (they import torch): the metrics of ``eval.metrics``,
    algorithm (with ``engine.fold_group``), server optimizer, model name and options, augmentations."""
    from fedray.algorithms import algorithm_of, build_server_optimizer
    from fedray.data.loader import Augment
    from fedray.data.table import DataError
    from fedray.engine.programs.fold_group import check_fold_group
    from fedray.models import MODELS

    load_plugins(cfg)
    check_metrics(cfg)
    check_fold_group(cfg, algorithm_of(cfg))  # partial sums on the workers: refused for incompatible algorithms
    build_server_optimizer(cfg.server.name, cfg.server.lr, cfg.server.params)
    if cfg.model.name not in MODELS:
        raise ConfigError(f"model.name: unknown model {cfg.model.name!r} (known: {', '.join(sorted(MODELS))})")
    opts = MODELS[cfg.model.name].options
    bad = sorted(set(cfg.model.params) - set(opts))
    if bad:
        raise ConfigError(f"model.params.{bad[0]}: unknown option of model {cfg.model.name!r} "
                          f"(known: {', '.join(sorted(opts))})")
    try:
        Augment.from_spec(cfg.train.augment)
    except DataError as e:
        raise ConfigError(f"train.{e}") from None


def check_metrics(cfg: ExperimentConfig) -> None:
    """Every name of ``eval.metrics`` is a registered metric (a built-in, or one a plugin of the config registers
    with ``fedray.register_metric``): a ConfigError naming ``eval.metrics[i]``."""
    if not cfg.eval.metrics:
        return
    from fedray.metrics.registry import METRICS

    for i, name in enumerate(cfg.eval.metrics):
        if name not in METRICS:
            hint = "" if cfg.plugins else "; a metric of your own is registered by a module named in plugins:"
            raise ConfigError(f"eval.metrics[{i}]: unknown metric {name!r} (known: {', '.join(sorted(METRICS))}{hint})")


def check_params_key(cfg: ExperimentConfig, path: str, owner: str, where: str, noun: str = "parameter path") -> None:
    """``path`` names a key of the free mapping ``owner`` (``algorithm.params``, ``server.params``, ``model.params``,
    ``data.params``, ``data.partition.params``: :func:`fedray.config_paths.check_path` says which): the key must be
    a parameter of the entry ``cfg`` chooses there (the chosen algorithm, ...), else a ConfigError starting with
    ``where`` and calling the path a ``noun``."""
    from fedray.algorithms import ALGORITHMS, SERVER_OPTIMIZERS
    from fedray.data.partition import PARTITIONERS
    from fedray.data.sources import SOURCES
    from fedray.models import MODELS

    load_plugins(cfg)
    entries = {"algorithm.params": ("algorithm", ALGORITHMS, cfg.algorithm.name, "algorithm.name",
                                    lambda e: e.params_spec),
               "server.params": ("server optimizer", SERVER_OPTIMIZERS, cfg.server.name, "server.name",
                                 lambda e: e.params_spec),
               "model.params": ("model", MODELS, cfg.model.name, "model.name", lambda e: e.options),
               "data.params": ("data source", SOURCES, cfg.data.source, "data.source", lambda e: e.params),
               "data.partition.params": ("partitioner", PARTITIONERS, cfg.data.partition.name,
                                         "data.partition.name", lambda e: e.params)}
    if owner not in entries:
        return
    what, registry, name, field, params = entries[owner]
    entry = registry.get(name)
    if entry is None:
        raise ConfigError(f"{field}: unknown {what} {name!r} (known: {', '.join(sorted(registry))})")
    key = path[len(owner) + 1:].split(".")[0]
    known = list(params(entry))
    if key not in known:
        raise ConfigError(f"{where}: unknown {noun}: {what} {name!r} has no parameter {key!r} "
                          f"(known: {', '.join(sorted(known)) or 'none'})")


def check_model(cfg: ExperimentConfig, meta) -> None:
    """Build the model once for the data's shape, so a bad option value fails before any work, naming
    ``model.params`` (the builders raise ValueError)."""
    from fedray.models import model_for_meta

    try:
        model = model_for_meta(cfg.model.name, meta, **cfg.model.params)
    except (ValueError, TypeError) as e:
        raise ConfigError(f"model.params: {e}") from None
    check_model_needs(cfg, model)


def check_model_needs(cfg: ExperimentConfig, model) -> None:
    """The model offers what the algorithm declares it needs (``Algorithm.model_needs``) and what
    ``eval.analysis_every`` needs (the ``embedding`` tap): a ConfigError naming the algorithm, the model (and the
    plugin it comes from) and what it lacks, before any work."""
    from fedray.algorithms import ALGORITHMS
    from fedray.algorithms.registry import MODEL_NEEDS
    from fedray.core.registry import is_builtin
    from fedray.models import MODELS, FedModel

    def has(need: str) -> bool:
        if not isinstance(model, FedModel):
            return False
        return "embedding" in model.feature_taps if need == "features" else bool(model.split_points)

    owner = MODELS.module(cfg.model.name)
    what = f"model {cfg.model.name!r}{'' if is_builtin(owner) else f' (plugin {owner})'}, a {type(model).__name__}"
    fix = ("build it as a fedray.FedModel, or return fedray.FedModel.wrap(features, classifier) from its builder "
           "(docs/extending.md)")
    for need in ALGORITHMS[cfg.algorithm.name].model_needs:
        if not has(need):
            raise ConfigError(f"algorithm.name: {cfg.algorithm.name!r} needs {MODEL_NEEDS[need]} of the model, which "
                              f"{what} lacks; {fix}")
    if cfg.eval.analysis_every and not has("features"):
        raise ConfigError(f"eval.analysis_every: the feature analysis needs {MODEL_NEEDS['features']}, which {what} "
                          f"lacks; {fix}, or set eval.analysis_every: 0")


def check_run(cfg: ExperimentConfig, meta) -> None:
    """Every check of ``cfg`` that needs the registries, for the partition's ``meta``: :func:`check_plugins`
    and :func:`check_data_fit`. A Ray run's coordinator actor makes them (its driver made :func:`check_driver`
    before the data) before the driver claims the run directory; the in-process backend makes the same checks
    in its own process, :func:`check_registries` before the data."""
    check_plugins(cfg)
    check_data_fit(cfg, meta)


def check_data_fit(cfg: ExperimentConfig, meta) -> None:
    """:func:`check_model` and, with ``engine.multi_client > 1``, whether the algorithm and the model can train
    clients in groups (:func:`fedray.engine.client.grouped.check_multi_client`)."""
    check_model(cfg, meta)
    if int(cfg.engine.multi_client) > 1:
        from fedray.engine.client.grouped import check_multi_client

        check_multi_client(cfg, meta)


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
