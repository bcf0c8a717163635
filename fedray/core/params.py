"""One schema for plugin parameters: :class:`ParamSpec` and the checks built on it.

A plugin (data source, partitioner, loss, evaluation hook, algorithm, server optimizer) declares its
parameters as ``{"name": ParamSpec(default, doc, type, ge=..., ...)}``; :func:`check_params` fills in the
defaults, rejects unknown keys (listing the known ones) and checks every value with :func:`check_value`,
which returns the value coerced to its declared type (``int`` -> ``float`` for numbers, integral floats
-> ``int`` for integers). Errors are raised with the exception type (or factory) the caller passes,
``DataError`` for the data layer and ``ConfigError`` for configuration, and the message starts with the
full field path, e.g. ``data.partition.params.alpha: must be > 0, got -1``::

    params = {"mu": ParamSpec(1e-3, "proximal weight", float, ge=0)}
    resolved = check_params(given, params, "algorithm.params", ConfigError)

``strict=False`` also reads values written as text (``"12"``, ``"1e-3"``, ``"yes"``) and any object with
``__float__`` / ``__index__`` (numpy scalars, one-element tensors), as command-line and Python callers
of the data sources and losses may pass them.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["ParamSpec", "check_value", "check_params", "defaults", "param_lines"]

ErrorFactory = Callable[[str], BaseException]

_TRUE = ("true", "yes", "1")
_FALSE = ("false", "no", "0")


@dataclass(frozen=True)
class ParamSpec:
    """One parameter: its default, a one-line description and optional constraints.

    ``type`` is ``bool``, ``int``, ``float`` or ``str`` (None: any value); ``ge``/``gt``/``le``/``lt`` bound
    numbers; ``choices`` lists the accepted values; ``nullable`` accepts None.
    """

    default: Any
    doc: str
    type: type | None = None
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    choices: tuple | None = None
    nullable: bool = False

    def bounds(self) -> str:
        """The numeric bounds as text: ``> 0``, ``>= 1``, ``in [0, 1]``, ``in (0, 1)`` ... ('' when none)."""
        lo = (f"[{self.ge}", self.ge) if self.ge is not None else (f"({self.gt}", self.gt) if self.gt is not None else None
        hi = (f"{self.le}]", self.le) if self.le is not None else (f"{self.lt})", self.lt) if self.lt is not None else None
        if lo and hi:
            return f"in {lo[0]}, {hi[0]}"
        if lo:
            return f"{'>=' if self.ge is not None else '>'} {lo[1]}"
        if hi:
            return f"{'<=' if self.le is not None else '<'} {hi[1]}"
        return ""

    def within(self, v: float) -> bool:
        return not ((self.ge is not None and v < self.ge) or (self.gt is not None and v <= self.gt)
                    or (self.le is not None and v > self.le) or (self.lt is not None and v >= self.lt))


def defaults(specs: Mapping[str, ParamSpec]) -> dict[str, Any]:
    """``{name: default}`` of a parameter table."""
    return {k: p.default for k, p in specs.items()}


class _Bad(Exception):
    """A value that does not have the declared type (the message is built by :func:`check_value`)."""


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool) or type(value).__name__ == "bool_"  # numpy.bool_ without importing numpy


def _as_bool(value: Any, strict: bool) -> bool:
    if _is_bool(value):
        return bool(value)
    if not strict:
        if isinstance(value, numbers.Integral) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in _TRUE + _FALSE:
            return value.lower() in _TRUE
    raise _Bad


def _as_int(value: Any, strict: bool) -> int:
    if _is_bool(value):
        raise _Bad
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and math.isfinite(float(value)) and float(value).is_integer():
        return int(float(value))
    if not strict and isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    raise _Bad


def _as_float(value: Any, strict: bool) -> float:
    if _is_bool(value) or (strict and not isinstance(value, numbers.Real)):
        raise _Bad
    try:
        return float(value)
    except (TypeError, ValueError):
        raise _Bad from None


_CONVERT = {bool: _as_bool, int: _as_int, float: _as_float}
_KIND = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def check_value(value: Any, spec: ParamSpec, path: str, error: ErrorFactory = ValueError, *, strict: bool = True,
                sep: str = ": ") -> Any:
    """Check one value against ``spec`` and return it coerced to ``spec.type``.

    Raises ``error(f"{path}{sep}{problem}")``, e.g. ``train.rounds: must be > 0, got 0``,
    ``pgd_steps: must be an integer >= 1, got 0.5``, ``remainder: must be one of ['drop', 'spread'], got 'x'``.
    """
    if value is None and spec.nullable:
        return None
    bounds = spec.bounds()
    out = value
    if spec.type is not None:
        try:
            if spec.type in _CONVERT:
                out = _CONVERT[spec.type](value, strict)
            elif not isinstance(value, spec.type):
                raise _Bad
        except _Bad:
            raise error(f"{path}{sep}must be {_expected(spec)}, got {value!r}") from None
        if spec.type is float and not math.isfinite(out):
            raise error(f"{path}{sep}must be a finite number{' ' + bounds if bounds else ''}, got {value!r}")
    if bounds:
        try:
            ok = spec.within(out)
        except TypeError:
            ok = False
        if not ok:
            raise error(f"{path}{sep}must be {bounds}, got {value!r}")
    if spec.choices is not None and out not in spec.choices:
        raise error(f"{path}{sep}must be one of {list(spec.choices)}, got {value!r}")
    return out


def _expected(spec: ParamSpec) -> str:
    """What a value of ``spec`` must be, as text: ``a number > 0``, ``an integer >= 1``, ``true or false``."""
    if spec.type is bool:
        return _KIND[bool]
    kind = "any value" if spec.type is None else _KIND.get(spec.type, spec.type.__name__)
    bounds = spec.bounds()
    return f"{kind} {bounds}" if bounds else kind


def _show(value: Any) -> str:
    """A default as it is written in a config file: ``null``, ``true``, ``samples``, ``[rotate, crop]``."""
    if value is None:
        return "null"
    if _is_bool(value):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


def param_lines(specs: Mapping[str, ParamSpec], indent: str = "    ") -> list[str]:
    """One line per parameter, ``name = default  (what a value must be)  doc``, as ``fedray datasets`` lists
    the parameters of every registry (sources, partitioners, algorithms, server optimizers)."""
    width = max((len(k) for k in specs), default=0)
    lines = []
    for name, spec in specs.items():
        rule = f"one of {list(spec.choices)}" if spec.choices is not None else _expected(spec)
        if spec.nullable:
            rule += " or null"
        rule = "" if rule == "any value" else f"({rule})  "  # an untyped value is described by its doc alone
        lines.append(f"{indent}{name:{width}s} = {_show(spec.default)}  {rule}{spec.doc}")
    return lines


def check_params(given: Mapping[str, Any], specs: Mapping[str, ParamSpec], path: str,
                 error: ErrorFactory = ValueError, *, strict: bool = True, fill_defaults: bool = True) -> dict[str, Any]:
    """Check a dict of parameters against ``specs``; return them (defaults first filled in) coerced.

    An unknown key raises ``error("<path>.<key>: unknown parameter(s) [...] (known: a, b)")``; every
    value is then checked with :func:`check_value` under the path ``<path>.<key>``.
    """
    unknown = sorted(set(given) - set(specs))
    if unknown:
        known = ", ".join(sorted(specs)) or "none"
        raise error(f"{path}.{unknown[0]}: unknown parameter(s) {unknown} (known: {known})")
    merged = {**defaults(specs), **given} if fill_defaults else dict(given)
    return {k: check_value(v, specs[k], f"{path}.{k}", error, strict=strict) for k, v in merged.items()}
