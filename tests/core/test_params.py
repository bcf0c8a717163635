"""fedray.core.params: one parameter schema for sources, partitioners, losses, eval hooks and config."""

from __future__ import annotations

import numpy as np
import pytest

from fedray.config import ConfigError
from fedray.core.params import ParamSpec, check_params, check_value, defaults


def test_positional_construction_and_defaults():
    spec = ParamSpec(1e-3, "proximal weight")
    assert (spec.default, spec.doc, spec.type, spec.nullable) == (1e-3, "proximal weight", None, False)
    assert defaults({"mu": spec, "k": ParamSpec(2, "k", int, ge=1)}) == {"mu": 1e-3, "k": 2}


def test_check_params_fills_defaults_coerces_and_names_the_path():
    specs = {"mu": ParamSpec(1e-3, "proximal weight", float, ge=0), "steps": ParamSpec(5, "steps", int, ge=1)}
    out = check_params({"mu": 1, "steps": np.int64(3)}, specs, "algorithm.params", ConfigError)
    assert out == {"mu": 1.0, "steps": 3} and type(out["mu"]) is float and type(out["steps"]) is int
    with pytest.raises(ConfigError, match=r"^algorithm\.params\.mu: must be >= 0, got -1$"):
        check_params({"mu": -1}, specs, "algorithm.params", ConfigError)
    with pytest.raises(ConfigError, match=r"^algorithm\.params\.steps: must be an integer >= 1, got 1\.5$"):
        check_params({"steps": 1.5}, specs, "algorithm.params", ConfigError)
    with pytest.raises(ConfigError, match=r"^algorithm\.params\.nu: unknown parameter\(s\) \['nu'\] \(known: mu, steps\)$"):
        check_params({"nu": 1}, specs, "algorithm.params", ConfigError)


@pytest.mark.parametrize("value, spec, strict, expected", [
    ("12", ParamSpec(0, "", int, ge=1), False, 12),
    ("yes", ParamSpec(False, "", bool), False, True),
    ("1e-3", ParamSpec(0.0, "", float), False, 1e-3),
    (None, ParamSpec(None, "", int, ge=1, nullable=True), True, None),
    (3, ParamSpec(None, "", int, choices=(1, 3)), True, 3),
])
def test_check_value_accepts(value, spec, strict, expected):
    assert check_value(value, spec, "p", strict=strict) == expected


@pytest.mark.parametrize("value, spec, strict, message", [
    ("12", ParamSpec(0, "", int), True, "p: must be an integer, got '12'"),
    (True, ParamSpec(0.0, "", float, gt=0), False, "p: must be a number > 0, got True"),
    (float("nan"), ParamSpec(0.0, "", float), True, "p: must be a finite number, got nan"),
    (1, ParamSpec(False, "", bool), True, "p: must be true or false, got 1"),
    (2, ParamSpec(0.5, "", float, ge=0, le=1), True, "p: must be in [0, 1], got 2"),
    (1.0, ParamSpec(0.5, "", float, gt=0, lt=1), True, "p: must be in (0, 1), got 1.0"),
    ("x", ParamSpec("a", "", choices=("a", "b")), True, "p: must be one of ['a', 'b'], got 'x'"),
    (None, ParamSpec(1, "", int), True, "p: must be an integer, got None"),
])
def test_check_value_rejects_with_the_path(value, spec, strict, message):
    with pytest.raises(ValueError) as e:
        check_value(value, spec, "p", strict=strict)
    assert str(e.value) == message


def test_error_factory_and_separator():
    with pytest.raises(KeyError):
        check_value(0, ParamSpec(1, "", int, ge=1), "k", lambda msg: KeyError(msg))
    with pytest.raises(ValueError, match="^tau must be > 0, got -1$"):
        check_value(-1, ParamSpec(None, "", float, gt=0), "tau", sep=" ")
