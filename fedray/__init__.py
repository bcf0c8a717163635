"""fedray: federated-learning simulation on Ray.

The public extension API (docs/extending.md), imported on first use so that ``import fedray`` stays light:

- ``fedray.register_algorithm`` (class decorator), ``register_model``, ``register_source``,
  ``register_partitioner``, ``register_server_optimizer``, ``register_metric``: add a name a config can choose;
  a name that exists (built-in or another plugin's) is refused, naming both modules;
- ``fedray.Algorithm``, ``fedray.ServerOptimizer``, ``fedray.FedModel``, ``fedray.ParamSpec``: what they subclass
  or declare;
- ``fedray.run``, ``load_run``, ``sweep``, ``tune``, ``fedray.data.from_arrays`` / ``from_hf``: the Python API
  for notebooks (docs/python-api.md).
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: public name -> (module, attribute), imported when first used
_LAZY = {
    "register_algorithm": ("fedray.algorithms", "register_algorithm"),
    "register_server_optimizer": ("fedray.algorithms", "register_server_optimizer"),
    "register_model": ("fedray.models.registry", "register_model"),
    "register_source": ("fedray.data.sources", "register_source"),
    "register_partitioner": ("fedray.data.partition", "register_partitioner"),
    "register_metric": ("fedray.metrics.registry", "register_metric"),
    "Algorithm": ("fedray.algorithms", "Algorithm"),
    "ServerOptimizer": ("fedray.algorithms.server_opt", "ServerOptimizer"),
    "FedModel": ("fedray.models", "FedModel"),
    "ParamSpec": ("fedray.core.params", "ParamSpec"),
    "ConfigError": ("fedray.core.errors", "ConfigError"),
    # the Python API for notebooks (docs/python-api.md)
    "run": ("fedray.api", "run"),
    "load_run": ("fedray.api", "load_run"),
    "sweep": ("fedray.api", "sweep"),
    "tune": ("fedray.api", "tune"),
    "RunResult": ("fedray.api", "RunResult"),
    "data": ("fedray.api", "data"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fedray' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
