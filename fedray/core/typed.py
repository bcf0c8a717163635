"""Typed dataclasses from plain mappings (a config file's): every field checked against its type hint, with
errors that name the dotted field."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any

from fedray.core.errors import ConfigError

__all__ = ["build_dataclass"]


def _resolve_hints(cls):
    return typing.get_type_hints(cls)


def _check_type(path: str, value: Any, hint: Any) -> Any:
    """Validate (and lightly coerce: int -> float) one value against a type hint."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (typing.Union, getattr(types, "UnionType", None)):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _check_type(path, value, a)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{path}: invalid value {value!r}")
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{path}: expected a mapping, got {type(value).__name__} {value!r}")
        return dict(value)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{path}: expected a list, got {type(value).__name__} {value!r}")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path}: expected true/false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path}: expected an integer, got {type(value).__name__} {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{path}: expected a number, got {type(value).__name__} {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path}: expected a string, got {type(value).__name__} {value!r}")
        return value
    if dataclasses.is_dataclass(hint):
        return build_dataclass(hint, value, path)
    return value


def build_dataclass(cls, data: Any, prefix: str = ""):
    """An instance of the dataclass ``cls`` from the mapping ``data``: unknown keys and values of the wrong type are
    a :class:`ConfigError` naming the dotted field (``prefix``); nested dataclasses are built the same way."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{prefix or 'config'}: expected a mapping, got {type(data).__name__} {data!r}")
    hints = _resolve_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        where = prefix or "config"
        raise ConfigError(
            f"{(prefix + '.' if prefix else '') + unknown[0]}: unknown field in {where} (known: {', '.join(sorted(names))})"
        )
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            p = f"{prefix}.{f.name}" if prefix else f.name
            kwargs[f.name] = _check_type(p, data[f.name], hints[f.name])
    return cls(**kwargs)
