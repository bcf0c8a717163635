"""Config loading, overrides, validation messages and the stable hash."""

from __future__ import annotations

import pytest

from fedray.config import ConfigError, config_hash, dump_config, from_dict, hashed_fields, load_config

YAML = """
seed: 3
data:
  source: mnist5k
  partition: {name: dirichlet, num_clients: 50, params: {alpha: 0.3}}
train: {rounds: 4, clients_per_round: 5, lr: 0.1}
"""

TOML = """
seed = 3
[data]
source = "mnist5k"
[data.partition]
name = "dirichlet"
num_clients = 50
params = { alpha = 0.3 }
[train]
rounds = 4
clients_per_round = 5
lr = 0.1
"""


def test_yaml_and_toml_give_the_same_config_and_hash(tmp_path):
    (tmp_path / "a.yaml").write_text(YAML)
    (tmp_path / "a.toml").write_text(TOML)
    a, b = load_config(tmp_path / "a.yaml"), load_config(tmp_path / "a.toml")
    assert a.to_dict() | {"source_path": None} == b.to_dict() | {"source_path": None}
    assert config_hash(a) == config_hash(b)
    assert a.data.partition.params == {"alpha": 0.3} and a.train.lr == 0.1


def test_overrides_are_typed_and_nested(tmp_path):
    (tmp_path / "a.yaml").write_text(YAML)
    cfg = load_config(tmp_path / "a.yaml", ["train.lr=0.5", "data.partition.params.alpha=0.05",
                                            "algorithm.params.mu=1e-3", "train.augment=[crop,flip]",
                                            "engine.backend=local"])
    assert cfg.train.lr == 0.5 and cfg.data.partition.params["alpha"] == 0.05
    assert cfg.algorithm.params == {"mu": 1e-3} and cfg.train.augment == ["crop", "flip"]
    assert cfg.engine.backend == "local"


def test_local_steps_enters_the_hash_only_when_set():
    """train.local_steps changes the numbers, so it is hashed when set; unset (null) it leaves the hashes (and run
    names) of configs written before the field existed unchanged."""
    base = from_dict({"train": {"rounds": 4}})
    assert config_hash(from_dict({"train": {"rounds": 4, "local_steps": None}})) == config_hash(base)
    five = from_dict({"train": {"rounds": 4, "local_steps": 5}})
    assert five.train.local_steps == 5 and config_hash(five) not in (config_hash(base), config_hash(
        from_dict({"train": {"rounds": 4, "local_steps": 6}})))


def test_hash_ignores_placement_but_not_numbers(tmp_path):
    base = from_dict({"train": {"rounds": 4}})
    same = from_dict({"train": {"rounds": 4}, "engine": {"num_workers": 4, "backend": "local",
                                                          "coordinator_placement": "any", "max_coordinator_restarts": 0},
                      "output": {"root": "/elsewhere"}})
    other = from_dict({"train": {"rounds": 4, "lr": 0.01}})
    assert config_hash(base) == config_hash(same) != config_hash(other)
    # the dumped config loads back to the same hash (what --resume relies on)
    assert config_hash(from_dict(__import__("yaml").safe_load(dump_config(base)))) == config_hash(base)


def test_hash_without_the_seed_names_the_experiment_and_hashed_fields_flatten_what_is_hashed():
    s0 = from_dict({"seed": 0, "data": {"partition": {"params": {"alpha": 0.05}}}, "train": {"augment": ["flip"]}})
    s1 = from_dict({"seed": 1, "data": {"partition": {"params": {"alpha": 0.05}}}, "train": {"augment": ["flip"]},
                    "engine": {"num_workers": 3}})
    assert config_hash(s0) != config_hash(s1)
    assert config_hash(s0, ignore=("seed",)) == config_hash(s1, ignore=("seed",))
    fixed = from_dict({"seed": 1, "data": {"partition": {"seed": 0, "params": {"alpha": 0.05}}},
                       "train": {"augment": ["flip"]}})
    assert config_hash(fixed, ignore=("seed",)) != config_hash(s1, ignore=("seed",))  # another partition seed
    fields = hashed_fields(s0, ignore=("seed",))
    assert fields["data.partition.params.alpha"] == 0.05 and fields["train.augment"] == ("flip",)
    assert "seed" not in fields and "engine.num_workers" not in fields and not any(k.startswith("output") for k in fields)
    assert fields == hashed_fields(s1, ignore=("seed",))


@pytest.mark.parametrize("data, msg", [
    ({"train": {"rounds": 0}}, "train.rounds: must be > 0"),
    ({"train": {"rounds": 2.5}}, "train.rounds: expected an integer"),
    ({"train": {"clients_per_round": 20}, "data": {"partition": {"num_clients": 10}}}, "train.clients_per_round"),
    ({"data": {"partition": {"params": {"alpha": -1}}}}, "data.partition.params.alpha: must be > 0"),
    ({"data": {"partition": {"nme": "iid"}}}, "data.partition.nme: unknown field"),
    ({"model": "cnn"}, "model: expected a mapping"),
    ({"eval": {"ema": 1.5}}, "eval.ema"),
    ({"engine": {"device": "tpu"}}, "engine.device"),
    ({"engine": {"coordinator_placement": "head"}}, "engine.coordinator_placement: must be 'driver' or 'any'"),
    ({"engine": {"max_coordinator_restarts": -1}}, "engine.max_coordinator_restarts"),
    ({"engine": {"backend": "local", "fault_injection": {"kind": "coordinator_exit", "round": 1}}},
     "engine.fault_injection: kind coordinator_exit needs engine.backend: ray"),
    ({"train": {"optimizer": "lbfgs"}}, "train.optimizer"),
    ({"train": {"local_steps": 0}}, "train.local_steps: must be an integer >= 1"),
    ({"train": {"local_steps": 2.5}}, "train.local_steps: expected an integer"),
])
def test_validation_names_the_field(data, msg):
    with pytest.raises(ConfigError) as e:
        from_dict(data)
    assert str(e.value).startswith(msg), str(e.value)


def test_bad_files_and_overrides(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("train: [1, 2")
    with pytest.raises(ConfigError, match="cannot parse"):
        load_config(tmp_path / "bad.yaml")
    (tmp_path / "ok.yaml").write_text(YAML)
    with pytest.raises(ConfigError, match="expected the form a.b=c"):
        load_config(tmp_path / "ok.yaml", ["train.lr"])
    with pytest.raises(ConfigError, match="train.lr"):
        load_config(tmp_path / "ok.yaml", ["train.lr.x=1"])


# ------------------------------------------------------------------------------------ example configs
def _example_configs():
    from tests.helpers import ROOT

    return sorted(p for p in (ROOT / "jobs" / "configs").glob("*.yaml") if not p.name.startswith("scale_"))


@pytest.mark.parametrize("path", _example_configs(), ids=lambda p: p.name)
def test_every_example_config_loads_and_names_registered_parts(path):
    """Every shipped experiment config validates and names a registered algorithm, server optimizer, model,
    source and partitioner with parameters they accept (what `fedray run` checks before any work)."""
    from fedray.algorithms import build_algorithm, build_server_optimizer
    from fedray.data.partition import PARTITIONERS
    from fedray.data.sources import SOURCES
    from fedray.models import MODELS

    cfg = load_config(path)
    build_algorithm(cfg.algorithm.name, cfg.algorithm.params, cfg)
    build_server_optimizer(cfg.server.name, cfg.server.lr, cfg.server.params)
    assert cfg.model.name in MODELS and cfg.data.source in SOURCES and cfg.data.partition.name in PARTITIONERS


def test_every_algorithm_and_server_optimizer_has_an_example_config():
    from fedray.algorithms import ALGORITHMS, SERVER_OPTIMIZERS

    cfgs = [load_config(p) for p in _example_configs()]
    algorithms = {c.algorithm.name for c in cfgs}
    servers = {c.server.name for c in cfgs}
    assert set(ALGORITHMS) - algorithms == set(), "algorithms without an example config in jobs/configs/"
    assert set(SERVER_OPTIMIZERS) - servers == set(), "server optimizers without an example config"
