"""Algorithm and server-optimizer parameters are declared once, as ``params_spec`` ParamSpec tables: their
defaults are the values the classes used before the schema, every typed parameter rejects a wrong type and
an out-of-range value under its field path, an unknown key lists the known ones, and ``fedray datasets``
prints the tables."""

from __future__ import annotations

import re

import pytest

from fedray.algorithms import ALGORITHMS, SERVER_OPTIMIZERS, build_algorithm, build_server_optimizer
from fedray.algorithms.base import Algorithm
from fedray.algorithms.server_opt import ServerOptimizer
from fedray.cli import main
from fedray.config import ConfigError
from fedray.core.params import ParamSpec, check_value, defaults

_W = {"weighting": "samples"}
_ADV = {"adv": "pgd", "adv_eps": 0.1, "adv_steps": 10, "adv_alpha": None, "adv_random_start": True}
_SPLIT = {"batch_size": 320, "local_iters": 5, "split_point": None, "server_lr": None}
_FEDCCL = {"tau": 0.07, "w_local": 1.0, "w_global": 1.0, "signals": "both", "local_mode": "clustered",
           "global_mode": "clustered", "tap": "auto"}

# the `defaults` dicts of the classes before params_spec, written out (values, key order)
ALGORITHM_DEFAULTS = {
    "fedavg": {**_W},
    "fedprox": {"mu": 2e-3, **_W},
    "fedrcl": {"lam": 0.7, "beta": 1.0, "tau": 0.05, "variant": "reference", "levels": "all", **_W},
    "fedscl": {"tau": 0.05, "variant": "reference", "levels": "all", **_W},
    "fedcl": {"tau": 0.05, "weight": 1.0, "levels": "all", "view_augment": ["rotate", "crop", "flip"], **_W},
    "fitnet": {"lam": 1e-3, "levels": "all", "reduce": "mean", **_W},
    "moon": {"mu": 1.0, "tau": 0.5, "projection": True, "proj_dim": 256, **_W},
    "fedlc": {"tau": 1.0, **_W},
    "fedla": {"tau": 1.0, **_W},
    "fedntd": {"beta": 0.3, "tau": 1.0, **_W},
    "feddecorr": {"beta": 0.01, **_W},
    "fedmlb": {"lam1": 1.0, "lam2": 1.0, "tau": 1.0, **_W},
    "fedproc": {"tau": 1.0, "tap": "auto", **_W},
    "feddyn": {"alpha": 0.1},
    "fedproto": {"mu": 1.0, "tap": "auto"},
    "fpl": {"tau": 0.02, "tap": "auto"},
    "fedpcl": {"tau": 0.07, "ce_weight": 1.0, "tap": "auto", "set_reduction": "sum", "views": 2,
               "view_augment": ["rotate", "crop", "flip"]},
    "fedccl": _FEDCCL,
    "fedccl_plus": {**_FEDCCL, **_ADV},
    "fedavg_plus": {**_W, **_ADV},
    "fedlogit": {"prior": "local", "zero_mode": "clamp", "eps": 1e-9, **_W},
    "scala": {**_SPLIT, "prior": "local", "server_prior": "batch", "zero_mode": "clamp", "eps": 1e-9,
              "grad_scale": "client"},
    "splitfed_v1": _SPLIT,
    "splitfed_v2": {**_SPLIT, "order": "client"},
    "splitfed_v3": _SPLIT,
    "sfl_local_loss": {**_SPLIT, "aux": "linear"},
}
SERVER_DEFAULTS = {
    "none": {},
    "fedavgm": {"momentum": 0.4},
    "fedadam": {"beta1": 0.9, "beta2": 0.99, "tau": 1e-3},
    "fedacg": {"lam": 0.85, "beta": 2e-3},
}


def _build(kind: str, name: str, params: dict):
    return build_algorithm(name, params) if kind == "algorithm" else build_server_optimizer(name, 1.0, params)


def _registry(kind: str) -> dict:
    return ALGORITHMS if kind == "algorithm" else SERVER_OPTIMIZERS


ENTRIES = [("algorithm", n) for n in sorted(ALGORITHMS)] + [("server", n) for n in SERVER_OPTIMIZERS]


def _bad_values(spec: ParamSpec) -> list:
    """A wrong-type value and one just outside each bound of a typed parameter."""
    if spec.type is bool:
        return ["yes", 1]
    if spec.type is str:
        return [3] + (["no-such-choice"] if spec.choices else [])
    if spec.type not in (int, float):
        return []
    out = ["1", True, [1]] + ([0.5] if spec.type is int else [float("nan")])
    for bound, outside in ((spec.ge, -1), (spec.gt, 0), (spec.le, 1), (spec.lt, 0)):
        if bound is not None:
            out.append(bound + outside)
    if spec.nullable is False:
        out.append(None)
    return out


# ------------------------------------------------------------------------------------------ defaults
def test_every_registered_class_is_covered():
    assert set(ALGORITHM_DEFAULTS) == set(ALGORITHMS)
    assert set(SERVER_DEFAULTS) == set(SERVER_OPTIMIZERS)


@pytest.mark.parametrize("kind, name", ENTRIES)
def test_spec_defaults_are_the_former_defaults(kind, name):
    expected = (ALGORITHM_DEFAULTS if kind == "algorithm" else SERVER_DEFAULTS)[name]
    spec = _registry(kind)[name].params_spec
    assert list(defaults(spec)) == list(expected)  # same keys, same order
    for k, v in expected.items():
        got = spec[k].default
        assert got == v and type(got) is type(v), (name, k, got, v)
    built = _build(kind, name, {})  # (fedscl's validate() adds its fixed beta and lam next to them)
    assert {k: v for k, v in built.params.items() if k in spec} == expected


def test_literal_defaults_of_a_few():
    assert build_algorithm("fedprox", {}).params["mu"] == 2e-3
    assert build_server_optimizer("fedadam", 0.01).params == {"beta1": 0.9, "beta2": 0.99, "tau": 1e-3}
    scala = build_algorithm("scala", {})
    assert (scala.params["batch_size"], scala.params["local_iters"], scala.params["eps"]) == (320, 5, 1e-9)
    assert build_server_optimizer("fedacg").client_hints().prox_mu == 2e-3


@pytest.mark.parametrize("kind, name", ENTRIES)
def test_every_parameter_is_documented_and_its_default_passes_its_own_check(kind, name):
    for k, spec in _registry(kind)[name].params_spec.items():
        assert isinstance(spec, ParamSpec) and spec.doc.strip(), (name, k)
        assert check_value(spec.default, spec, k) == spec.default


# ------------------------------------------------------------------------------------------ errors
@pytest.mark.parametrize("kind, name", ENTRIES)
def test_wrong_type_and_out_of_range_values_name_the_field(kind, name):
    spec = _registry(kind)[name].params_spec
    checked = 0
    for k, p in spec.items():
        for bad in _bad_values(p):
            with pytest.raises(ConfigError, match=rf"^{kind}\.params\.{k}: "):
                _build(kind, name, {k: bad})
            checked += 1
    numeric = [k for k, p in spec.items() if p.type in (int, float)]
    assert checked >= 5 * len(numeric)


def test_bounds_of_a_few():
    for params, field in [({"mu": -1e-9}, "mu"), ({"weighting": "bytes"}, "weighting")]:
        with pytest.raises(ConfigError, match=rf"^algorithm\.params\.{field}: must be"):
            build_algorithm("fedprox", params)
    build_algorithm("fedprox", {"mu": 0})  # mu >= 0
    for params in ({"tau": 0}, {"beta1": 1.0}, {"beta2": -0.1}):
        with pytest.raises(ConfigError, match=rf"^server\.params\.{next(iter(params))}: must be"):
            build_server_optimizer("fedadam", 0.01, params)
    build_server_optimizer("fedadam", 0.01, {"beta1": 0.0, "beta2": 0.0, "tau": 1e-12})
    with pytest.raises(ConfigError, match=r"^algorithm\.params\.local_iters: must be >= 1, got 0$"):
        build_algorithm("splitfed_v1", {"local_iters": 0})
    with pytest.raises(ConfigError, match=r"^algorithm\.params\.lam: must be in \[-1\.0, 1\.0\], got 1\.5$"):
        build_algorithm("fedrcl", {"lam": 1.5})


def test_values_are_coerced_to_their_declared_type():
    algo = build_algorithm("scala", {"batch_size": 64.0, "server_lr": 1})
    assert algo.params["batch_size"] == 64 and type(algo.params["batch_size"]) is int
    assert algo.params["server_lr"] == 1.0 and type(algo.params["server_lr"]) is float
    assert type(build_algorithm("fedprox", {"mu": 0}).params["mu"]) is float


@pytest.mark.parametrize("kind, name", ENTRIES)
def test_unknown_key_names_it_and_the_known_ones(kind, name):
    known = ", ".join(sorted(_registry(kind)[name].params_spec)) or "none"
    with pytest.raises(ConfigError, match=rf"^{kind}\.params\.no_such_param: unknown parameter.*"
                                          rf"\(known: {re.escape(known)}\)$"):
        _build(kind, name, {"no_such_param": 1})


def test_a_defaults_dict_on_a_plugin_class_is_refused():
    with pytest.raises(TypeError, match="params_spec"):
        type("Stale", (Algorithm,), {"name": "stale", "defaults": {"mu": 1.0}})
    with pytest.raises(TypeError, match="params_spec"):
        type("StaleOpt", (ServerOptimizer,), {"name": "stale", "defaults": {"m": 1.0}})


# ------------------------------------------------------------------------------------------ listing
def test_datasets_lists_parameters_with_default_rule_and_doc(capsys):
    assert main(["datasets"]) == 0
    out = capsys.readouterr().out
    for name, cls in [*ALGORITHMS.items(), *SERVER_OPTIMIZERS.items()]:
        for k, spec in cls.params_spec.items():
            assert re.search(rf"^\s+{k}\s+= .*{re.escape(spec.doc)}$", out, re.M), (name, k)
    assert re.search(r"^\s+mu\s+= 0\.002  \(a number >= 0\)  ", out, re.M)  # fedprox
    assert re.search(r"^\s+tau\s+= 0\.001  \(a number > 0\)  ", out, re.M)  # fedadam
    assert re.search(r"^\s+beta1 = 0\.9  \(a number in \[0, 1\)\)  ", out, re.M)
    assert re.search(r"^\s+split_point\s+= null  \(a string or null\)  ", out, re.M)
