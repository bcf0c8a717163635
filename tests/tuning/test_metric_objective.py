"""A study whose objective is a metric of eval.metrics: a built-in, or one a plugin of the base config registers
(two short in-process trials); an objective naming an evaluation metric the base config does not compute is
refused when the study is loaded."""

from __future__ import annotations

import textwrap

import pytest

from fedray.config import ConfigError
from fedray.core import plugin_loader
from fedray.reporting.rundir import RunDir
from tests.tuning.studies import study_dict, write_study

optuna = pytest.importorskip("optuna")

from tuning.driver import tune  # noqa: E402
from tuning.study import load_study  # noqa: E402

PLUGIN = '''
import numpy as np

import fedray


def partial(logits, labels, domains):
    wrong = logits.argmax(1) != labels
    return {"wrong": np.int64(int(wrong.sum())), "n": np.int64(len(labels))}


fedray.register_metric("error_rate", partial, lambda s: {"": int(s["wrong"]) / int(s["n"])})
'''


@pytest.fixture
def plugin(tmp_path):
    (tmp_path / "studymetric.py").write_text(textwrap.dedent(PLUGIN))
    yield
    plugin_loader._forget("studymetric")


def test_a_plugin_metric_is_the_objective(tmp_path, partition_cache, plugin, monkeypatch):
    import tuning.outputs

    monkeypatch.setattr(tuning.outputs, "IMPORTANCE_TREES", 8)
    d = study_dict(tmp_path, partition_cache, name="custom_objective", budget={"n_trials": 2},
                   objective={"metric": "error_rate", "direction": "minimize"})
    d["base_config"]["train"]["rounds"] = 1
    d["base_config"]["plugins"] = ["studymetric.py"]  # relative to the study file's directory
    d["base_config"]["eval"]["metrics"] = ["error_rate", "balanced_accuracy"]
    res = tune(write_study(tmp_path / "custom.yaml", d), output_dir=tmp_path / "studies", log=lambda m: None)
    assert [t.state.name for t in res.trials] == ["COMPLETE", "COMPLETE"]
    for t in res.trials:
        row = RunDir(t.user_attrs["run_dir"]).read_metrics()[-1]
        assert t.values == [row["error_rate"]] and row["error_rate"] == pytest.approx(1 - row["accuracy"])
    assert "error_rate" in (tmp_path / "studies" / "custom_objective" / "trials.csv").read_text().splitlines()[0]


def test_an_objective_the_base_config_does_not_compute_is_refused(tmp_path, partition_cache):
    d = study_dict(tmp_path, partition_cache, objective={"metric": "balanced_accuracy", "direction": "maximize"})
    with pytest.raises(ConfigError, match=r"objective.metric: 'balanced_accuracy' is an evaluation metric that the "
                                          r"base config does not compute; add eval.metrics: \[balanced_accuracy\]"):
        load_study(write_study(tmp_path / "s.yaml", d))
    d = study_dict(tmp_path, partition_cache, objective={"metric": "per_class_accuracy.3", "direction": "maximize"})
    d["base_config"]["eval"]["metrics"] = ["per_class_accuracy"]
    assert load_study(write_study(tmp_path / "s.yaml", d)).objectives[0].metric == "per_class_accuracy.3"
