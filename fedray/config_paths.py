"""Dotted config paths (``train.lr``, ``data.partition.params.alpha``): check one against the config's sections,
set it in a config mapping, read it from a mapping or a config.

The one helper behind every ``a.b=c`` of fedray: command-line overrides (:func:`fedray.config.apply_overrides`),
sweep axes (:mod:`fedray.apps.sweep_spec`), study parameters (``tuning``) and dotted metric keys of round reports
(:mod:`fedray.reporting.seeds`, the study objectives). It knows the config's shape through the dataclass it is
given (``ExperimentConfig``), not the registries: whether ``algorithm.params.mu`` is a parameter of the chosen
algorithm is :func:`fedray.plugins.check_params_key`'s question.
"""

from __future__ import annotations

import copy
import dataclasses
import re
import typing
from typing import Any

from fedray.core.errors import ConfigError

__all__ = ["check_path", "get_path", "is_path", "set_path", "split_path"]

_PART = re.compile(r"[^.\s=]+")


def is_path(path: Any) -> bool:
    """Whether ``path`` is a dotted name: non-empty parts without blanks or ``=``."""
    return isinstance(path, str) and bool(path) and all(_PART.fullmatch(p) for p in path.split("."))


def split_path(path: Any, where: str | None = None) -> list[str]:
    """``"a.b.c"`` -> ``["a", "b", "c"]``; a ConfigError (prefixed with ``where``) for anything else."""
    if not is_path(path):
        raise ConfigError(f"{where or 'field'}: {path!r} is not a dotted config field (e.g. data.partition.params.alpha)")
    return path.split(".")


def get_path(node: Any, path: str, default: Any = None) -> Any:
    """``node["a"]["b"]`` (or ``node.a.b`` for a config and its sections) for ``path`` ``a.b``; ``default`` when a
    part is missing."""
    for part in path.split("."):
        if isinstance(node, dict):
            if part not in node:
                return default
            node = node[part]
        elif dataclasses.is_dataclass(node) and not isinstance(node, type) and hasattr(node, part):
            node = getattr(node, part)
        else:
            return default
    return node


def set_path(data: dict, path: str, value: Any, *, where: str | None = None) -> dict:
    """Set ``data[a][b][c] = value`` (a copy of it) for ``path = "a.b.c"``, creating the mappings on the way; a part
    that holds something else than a mapping is a ConfigError. Returns ``data``."""
    parts = split_path(path, where)
    node = data
    for i, part in enumerate(parts[:-1]):
        nxt = node.get(part)
        if nxt is None:
            nxt = node[part] = {}
        if not isinstance(nxt, dict):
            raise ConfigError(f"{where or path}: {'.'.join(parts[: i + 1])} is {nxt!r}, cannot set {path}")
        node = nxt
    node[parts[-1]] = copy.deepcopy(value)
    return data


def check_path(path: str, where: str, root: type, *, leaf: bool = False, noun: str = "config field") -> str | None:
    """``path`` must name a field of the config dataclass ``root`` (``ExperimentConfig``), a section of it, or a key
    under one of its free mappings (``algorithm.params``, ``data.partition.params``, ...). With ``leaf`` it must
    name one value: not a whole section nor a whole mapping. Errors start with ``where`` and call the path a
    ``noun``. Returns the free mapping a key lives under (``"algorithm.params"``), else None."""
    parts = split_path(path, where)
    cls: Any = root
    owner = None
    for i, part in enumerate(parts):
        here = ".".join(parts[:i])
        if cls is dict:  # a key under a free mapping: its owner (a registry entry) says which keys exist
            return owner
        if not dataclasses.is_dataclass(cls):
            raise ConfigError(f"{where}: {here} is a single value, it has no field {part!r}")
        names = [f.name for f in dataclasses.fields(cls) if f.name != "source_path"]
        if part not in names:
            raise ConfigError(f"{where}: unknown {noun} ({here or 'the config'} has no field {part!r}; "
                              f"known: {', '.join(names)})")
        hint = typing.get_type_hints(cls)[part]
        if typing.get_origin(hint) is dict:
            cls, owner = dict, ".".join(parts[: i + 1])
        else:
            cls = hint if dataclasses.is_dataclass(hint) else None
    if leaf and cls is dict:
        raise ConfigError(f"{where}: is a mapping; name one of its keys, e.g. {path}.<key>")
    if leaf and cls is not None:
        raise ConfigError(f"{where}: is a whole section; name one of its fields "
                          f"({', '.join(f.name for f in dataclasses.fields(cls))})")
    return None
