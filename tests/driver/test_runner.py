"""fedray.driver.runner: configs and registry names that fail before any work, missing data, over-selection.

Whole runs on Ray (determinism, faults, resume) are in tests/integration/."""

from __future__ import annotations

import pytest

from fedray.config import ConfigError, from_dict
from fedray.driver.runner import run_experiment
from tests.helpers import small_config


def _run(cfg: dict, **kw):
    return run_experiment(from_dict(cfg), progress=False, log=lambda *a: None, **kw)


# ------------------------------------------------------------------------------------ config errors
@pytest.mark.parametrize("over, field", [
    ({"train__clients_per_round": 200}, "train.clients_per_round"),
    ({"data__partition__params": {"alpha": 0}}, "data.partition.params.alpha"),
    ({"train__lr": "fast"}, "train.lr"),
    ({"train__bogus": 1}, "train.bogus"),
    ({"engine__backend": "spark"}, "engine.backend"),
])
def test_bad_config_fails_before_any_work(tmp_path, partition_cache, over, field):
    cfg = small_config(tmp_path, partition_cache, **over)
    with pytest.raises(ConfigError) as e:
        _run(cfg)
    assert str(e.value).startswith(field), str(e.value)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("over, field", [
    ({"data__source": "imagenet-1k"}, "data.source"),
    ({"model__name": "gpt5"}, "model.name"),
    ({"algorithm__name": "fedmagic"}, "algorithm.name"),
    ({"algorithm__name": "fedprox", "algorithm__params": {"mu": -1}}, "algorithm.params.mu"),
    ({"server__name": "fedyogi"}, "server.name"),
])
def test_unknown_registry_names_fail_with_field(tmp_path, partition_cache, over, field):
    with pytest.raises(ConfigError) as e:
        _run(small_config(tmp_path, partition_cache, **over))
    assert str(e.value).startswith(field), str(e.value)
    assert not (tmp_path / "runs").exists()


def test_missing_dataset_path_is_a_clear_error(tmp_path, partition_cache):
    from fedray.data.table import DataError

    cfg = small_config(tmp_path, partition_cache, data__source="cifar10", data__root=str(tmp_path / "nowhere"))
    with pytest.raises(DataError) as e:
        _run(cfg)
    assert "nowhere" in str(e.value)


# ------------------------------------------------------------------------------------ stragglers
def test_over_selection_keeps_the_first_k_finished(tmp_path, partition_cache):
    cfg = small_config(tmp_path, partition_cache, train__rounds=1, train__clients_per_round=6,
                       engine__over_selection=0.5)
    res = _run(cfg)
    r = res.rounds[0]
    assert r["num_clients"] == 6 and r["stragglers_cancelled"] == 3


@pytest.mark.ray
@pytest.mark.parametrize("over, field", [
    ({"algorithm__name": "fedmagic"}, "algorithm.name"),
    ({"data__source": "imagenet-1k"}, "data.source"),  # the driver's own check, before the data
    ({"model__params": {"hidden": 0}}, "model.params"),  # the model built for the data's shape
    ({"engine__multi_client": 2, "algorithm__name": "moon"}, "engine.multi_client"),
])
def test_ray_run_checks_on_its_coordinator_before_claiming_the_run_dir(tmp_path, partition_cache, ray_session,
                                                                       over, field):
    """With Ray the registry and model checks run on the coordinator actor (the driver imports no torch):
    the same ConfigError, naming the field, and no run directory."""
    with pytest.raises(ConfigError) as e:
        _run(small_config(tmp_path, partition_cache, engine__backend="ray", **over))
    assert type(e.value) is ConfigError and str(e.value).startswith(field), repr(e.value)
    runs = tmp_path / "runs"  # output.root is checked (created) before the data; no run directory in it
    assert not runs.exists() or list(runs.iterdir()) == []
