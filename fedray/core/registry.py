"""One kind of registry for every name a config can choose: algorithms, models, data sources, partitioners,
server optimizers and evaluation metrics.

A :class:`Registry` is a read-only mapping ``name -> entry``; entries come in only through its
:meth:`~Registry.add` (called by the public ``fedray.register_*`` functions), which records the module that
registered each name and refuses a name that is already taken, naming both modules. So a plugin cannot
silently replace a built-in (``MODELS["fedavg_cnn"] = MyMLP`` raises ``TypeError`` at that line), and two
plugins cannot both claim one name. Every registry created in a process is listed in :data:`ALL`, so the plugin
loader (:mod:`fedray.core.plugin_loader`) can tell what a plugin registered without importing the registries'
packages (some of them import torch).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["ALL", "Registry", "RegistryError", "caller_module", "first_line", "is_builtin", "param_table",
           "register_function"]

T = TypeVar("T")

#: every registry created in this process, by kind ("algorithm", "model", ...)
ALL: dict[str, Registry] = {}


class RegistryError(ValueError):
    """A name registered twice, or an entry that breaks its registry's contract."""


def is_builtin(module: str) -> bool:
    """Whether ``module`` is part of fedray itself."""
    return module == "fedray" or module.startswith("fedray.")


def caller_module(depth: int = 2) -> str:
    """The ``__name__`` of the module that called the function calling this one (``depth`` frames up)."""
    frame: types.FrameType | None = sys._getframe(depth)
    while frame is not None:
        name = frame.f_globals.get("__name__", "?")
        if name not in (__name__, "fedray", "fedray.api") and not frame.f_code.co_name.startswith("register"):
            return name
        frame = frame.f_back
    return "?"


def first_line(description: str, fn: Any) -> str:
    """An entry's one-line description: ``description``, else the first line of ``fn``'s docstring."""
    return description or (getattr(fn, "__doc__", None) or "").strip().split("\n")[0]


def param_table(params: Any, where: str) -> dict:
    """A register function's ``params``: None or a mapping of names to :class:`~fedray.core.params.ParamSpec`."""
    from fedray.core.params import ParamSpec

    if params is not None and not (isinstance(params, dict) and all(isinstance(v, ParamSpec) for v in params.values())):
        raise RegistryError(f"{where}: params must map parameter names to fedray.ParamSpec, got {params!r}")
    return dict(params or {})


def register_function(registry: "Registry", name: str, fn: Any, owner: str, where: str, entry) -> Any:
    """What every function-registering ``register_*`` does, called directly (``fn`` given) or as a decorator
    (``fn`` None): check ``fn`` is callable, add ``entry(fn)`` (the registry's spec) under ``name`` for ``owner``,
    return ``fn``."""

    def add(f):
        if not callable(f):
            raise RegistryError(f"{where}: the {registry.kind} {name!r} needs a callable, got {f!r}")
        registry.add(name, entry(f), owner)
        return f

    return add if fn is None else add(fn)


def _owner_text(module: str) -> str:
    return f"{module} (built-in)" if is_builtin(module) else module


class Registry(Mapping, Generic[T]):
    """Names of one ``kind`` -> entries, read-only except through :meth:`add`; :meth:`module` names the module
    that registered an entry."""

    def __init__(self, kind: str, register_with: str):
        if kind in ALL:
            raise RegistryError(f"a registry of {kind}s exists already")
        self.kind = kind
        self.register_with = register_with  # the public function, named in errors
        self._entries: dict[str, T] = {}
        self._modules: dict[str, str] = {}
        ALL[kind] = self

    def add(self, name: str, entry: T, module: str) -> T:
        """Register ``entry`` under ``name`` for ``module``; a name taken by another module is a
        :class:`RegistryError` naming both (the same module registering it again, e.g. a plugin file re-imported
        after an edit, replaces its own entry)."""
        if not isinstance(name, str) or not name.strip() or name != name.strip():
            raise RegistryError(f"{self.register_with}: a {self.kind} needs a non-empty name without surrounding "
                                f"spaces, got {name!r} (from {module})")
        if name in self._entries:
            old = self._modules[name]
            if old != module:
                raise RegistryError(f"{self.kind} {name!r} is registered by {_owner_text(old)}; {module} cannot register "
                                    f"it again: choose another name")
        self._entries[name] = entry
        self._modules[name] = module
        return entry

    def module(self, name: str) -> str:
        """The module that registered ``name``."""
        return self._modules[name]

    def plugin_names(self) -> list[str]:
        """Names registered by modules outside fedray, in registration order."""
        return [n for n, m in self._modules.items() if not is_builtin(m)]

    def owned_by(self, package: str) -> list[str]:
        """Names registered by ``package`` or one of its submodules."""
        return [n for n, m in self._modules.items() if m == package or m.startswith(package + ".")]

    def _remove_owned_by(self, package: str) -> None:
        """Tests only: forget what ``package`` registered (a test that loads a plugin in-process)."""
        for n in self.owned_by(package):
            del self._entries[n], self._modules[n]

    # ------------------------------------------------------------------ read-only mapping
    def __getitem__(self, name: str) -> T:
        return self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __setitem__(self, name: str, value: Any) -> None:
        raise TypeError(f"the {self.kind} registry is read-only: register {name!r} with {self.register_with}(...) "
                        f"(a name that exists, built-in or not, cannot be replaced)")

    def __delitem__(self, name: str) -> None:
        raise TypeError(f"the {self.kind} registry is read-only: {name!r} cannot be removed")

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._entries)})"

