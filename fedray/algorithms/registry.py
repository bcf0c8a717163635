"""The algorithm registry: names -> :class:`~fedray.algorithms.base.Algorithm` classes, filled by
:func:`register` (``fedray.register_algorithm``), and building the algorithm a config names."""

from __future__ import annotations

from fedray.algorithms.base import Algorithm
from fedray.config import ConfigError
from fedray.core.registry import Registry, RegistryError

__all__ = ["ALGORITHMS", "MODEL_NEEDS", "algorithm_of", "build_algorithm", "register"]

ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm", "fedray.register_algorithm")
#: what an algorithm may need of a model (``Algorithm.model_needs``), as errors describe it
MODEL_NEEDS = {"features": "feature taps (forward_features(x, taps) with an 'embedding' tap)",
               "split": "split points (split(point) into a client and a server part)"}


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: register an :class:`Algorithm` subclass under its ``name`` (the built-ins use it; a
    plugin's public name for it is :func:`fedray.register_algorithm`). A name another module registered is
    refused, naming both modules."""
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        raise RegistryError(f"register_algorithm: expected a subclass of fedray.algorithms.Algorithm, got {cls!r}")
    if not cls.name:
        raise RegistryError(f"register_algorithm: {cls.__module__}.{cls.__qualname__} has no name (set the class "
                            f"attribute name = '...')")
    if cls.program not in ("federated", "split"):
        raise RegistryError(f"register_algorithm: {cls.__qualname__}.program must be 'federated' or 'split', got "
                            f"{cls.program!r}")
    bad = sorted(set(cls.model_needs) - set(MODEL_NEEDS)) if isinstance(cls.model_needs, tuple) else [cls.model_needs]
    if bad:
        raise RegistryError(f"register_algorithm: {cls.__qualname__}.model_needs must be a tuple of "
                            f"{' / '.join(map(repr, MODEL_NEEDS))}, got {cls.model_needs!r}")
    ALGORITHMS.add(cls.name, cls, cls.__module__)
    return cls


def build_algorithm(name: str, params: dict | None, cfg=None) -> Algorithm:
    from fedray import algorithms  # noqa: F401  (imports every module so they register)

    if name not in ALGORITHMS:
        raise ConfigError(f"algorithm.name: unknown algorithm {name!r} (known: {', '.join(sorted(ALGORITHMS))})")
    return ALGORITHMS[name](params, cfg)


def algorithm_of(cfg) -> Algorithm:
    """The algorithm an experiment config names (``algorithm.name`` with ``algorithm.params``)."""
    return build_algorithm(cfg.algorithm.name, cfg.algorithm.params, cfg)
