"""tuning.study: study files, their errors and the shipped studies."""

from __future__ import annotations

import pytest
import yaml

from fedray.config import ConfigError
from tests.helpers import ROOT
from tests.tuning.studies import base_config, study_dict, write_study

optuna = pytest.importorskip("optuna")

from tuning.backend import make_pruner, session_seed  # noqa: E402
from tuning.study import load_study, parse_study  # noqa: E402


# ------------------------------------------------------------------------------------ study files
def _err(data, tmp_path) -> str:
    with pytest.raises(ConfigError) as e:
        parse_study(data, source_path=tmp_path / "s.yaml")
    return str(e.value)


@pytest.mark.parametrize("edit, expected", [
    (lambda d: d["params"].update({"train.lrr": {"type": "float", "low": 0.1, "high": 0.2}}),
     "params.train.lrr: unknown parameter path"),
    (lambda d: d["params"].update({"algorithm.params.muu": {"type": "float", "low": 0.1, "high": 0.2}}),
     "params.algorithm.params.muu: unknown parameter path: algorithm 'fedprox' has no parameter 'muu'"),
    (lambda d: d["params"].update({"model.params.width": {"type": "int", "low": 1, "high": 4}}),
     "params.model.params.width: unknown parameter path: model 'fedavg_cnn'"),
    (lambda d: d["params"].update({"train": {"type": "float", "low": 0.1, "high": 0.2}}),
     "params.train: is a whole section"),
    (lambda d: d["params"].update({"train.lr.x": {"type": "float", "low": 0.1, "high": 0.2}}),
     "params.train.lr.x: train.lr is a single value"),
    (lambda d: d["params"].update({"train.lr": {"type": "float", "low": 0.1, "high": 0.1}}),
     "params.train.lr: empty range"),
    (lambda d: d["params"].update({"train.lr": {"type": "float", "low": 0.0, "high": 0.1, "log": True}}),
     "params.train.lr.low: must be > 0 for a log range"),
    (lambda d: d["params"].update({"train.lr": {"type": "float", "low": -0.1, "high": 0.1}}),
     "params.train.lr = -0.1: train.lr: must be >= 0"),
    (lambda d: d["params"].update({"train.local_epochs": {"type": "int", "low": 1.5, "high": 3}}),
     "params.train.local_epochs.low: expected an integer"),
    (lambda d: d["params"].update({"model.name": {"type": "categorical", "choices": []}}),
     "params.model.name.choices: expected a non-empty list"),
    (lambda d: d["params"].update({"model.name": {"type": "categorical", "choices": ["fedavg_cnn", "nope"]}}),
     "params.model.name = 'nope': model.name: unknown model 'nope'"),
    (lambda d: d["params"].update({"train.lr": {"type": "double", "low": 0.1, "high": 0.2}}),
     "params.train.lr.type: must be float, int or categorical"),
    (lambda d: d.update(params={}), "params: expected a non-empty mapping"),
    (lambda d: d.update(sampler="cmaes"), "sampler.name: unknown sampler 'cmaes'"),
    (lambda d: d.update(sampler={"name": "tpe", "n_startup": 3}), "sampler.n_startup: unknown option"),
    (lambda d: d.update(sampler="grid"), "params.algorithm.params.mu: the grid sampler needs `step`"),
    (lambda d: d.update(pruner="asha"), "pruner.name: unknown pruner 'asha'"),
    (lambda d: d.update(pruner={"name": "hyperband", "min_resource": 9}), "pruner.min_resource: must be in [1, 2]"),
    (lambda d: d.update(base_config="missing.yaml"), "base_config: file 'missing.yaml' not found"),
    (lambda d: d.pop("base_config"), "base_config: required"),
    (lambda d: d["base_config"]["algorithm"].update(name="nosuch"), "base_config: algorithm.name: unknown algorithm"),
    (lambda d: d["base_config"]["train"].update(rounds=0), "base_config: train.rounds: must be > 0"),
    (lambda d: d.update(objective={"metric": "loss", "direction": "up"}), "objective.direction: must be maximize"),
    (lambda d: d.update(objective={"metric": "seconds.train"}), "objective.direction: required for metric"),
    (lambda d: d.update(multi_objective=[{"metric": "accuracy"}, {"metric": "bytes_total"}], pruner="median"),
     "multi_objective: give either objective or multi_objective"),
    (lambda d: (d.pop("objective"), d.update(multi_objective=[{"metric": "accuracy"}, {"metric": "bytes_total"}],
                                             pruner="median")), "pruner.name: 'median' cannot be used with multi_objective"),
    (lambda d: d.update(budget={"n_trials": 0}), "budget.n_trials: must be >= 1"),
    (lambda d: d.update(budget={"trials": 3}), "budget.trials: unknown key"),
    (lambda d: d.update(trial_resources={"workers": 0}), "trial_resources.workers: must be >= 1"),
    (lambda d: d.update(concurrency="many"), "concurrency: expected an integer"),
    (lambda d: d.update(enqueue=[{"train.lr": 0.5}]), "enqueue[0].train.lr: 0.5 is outside [0.02, 0.08]"),
    (lambda d: d.update(enqueue=[{"train.momentum": 0.5}]), "enqueue[0].train.momentum: unknown key"),
    (lambda d: d.update(storge="x"), "storge: unknown key in the study file"),
])
def test_bad_study_files_name_the_field(tmp_path, partition_cache, edit, expected):
    d = study_dict(tmp_path, partition_cache)
    edit(d)
    msg = _err(d, tmp_path)
    assert expected in msg, msg


def test_study_file_defaults_paths_and_cli_error(tmp_path, partition_cache, capsys):
    cfg_file = tmp_path / "base.yaml"
    cfg_file.write_text(yaml.safe_dump(base_config(tmp_path, partition_cache)))
    d = study_dict(tmp_path, partition_cache, base_config="base.yaml", base_overrides=["train.rounds=3"])
    d.pop("objective")
    d.pop("pruner")
    d.pop("sampler")
    spec = load_study(write_study(tmp_path / "s.yaml", d))
    assert spec.base_config_path == str(cfg_file.resolve())
    assert spec.base_config["train"]["rounds"] == 3 and spec.max_rounds() == 3
    assert spec.objectives[0].metric == "ema_accuracy" and spec.directions == ["maximize"]
    assert spec.sampler.name == "tpe" and spec.pruner.name == "hyperband"
    pruner = make_pruner(spec)
    assert isinstance(pruner, optuna.pruners.HyperbandPruner) and pruner._max_resource == 3
    assert session_seed(7, 0) == 7 and session_seed(7, 5) != 7

    bad = write_study(tmp_path / "bad.yaml", study_dict(tmp_path, partition_cache, sampler="annealing"))
    from fedray.cli import main

    assert main(["tune", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "fedray tune: error: sampler.name: unknown sampler 'annealing'" in err and str(bad) in err


@pytest.mark.parametrize("name", ["fedrcl_lbt", "fedccl_tau", "scala_server"])
def test_shipped_studies_parse(name):
    """Structure only: the algorithms they tune may not be installed in this checkout."""
    spec = load_study(ROOT / "tuning" / "studies" / f"{name}.yaml", check_registries=False)
    assert spec.name == name and spec.params and spec.n_trials >= 1
    if name == "fedrcl_lbt":
        lam, beta, tau = (spec.param(f"algorithm.params.{k}") for k in ("lam", "beta", "tau"))
        assert (lam.low, lam.high, lam.log) == (0.3, 0.95, False)
        assert (beta.low, beta.high, beta.log) == (0.01, 10.0, True)
        assert (tau.low, tau.high, tau.log) == (0.02, 0.5, True)
        assert spec.base_config["data"]["source"] == "mnist5k"
