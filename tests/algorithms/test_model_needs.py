"""What algorithms need of a model (``Algorithm.model_needs``), checked before any work: a plain ``nn.Module``
trains with every algorithm that declares nothing, is refused naming the algorithm and what it lacks by every
other one, and the same modules wrapped with ``FedModel.wrap`` train with all of them. Running every built-in
algorithm is what keeps the declarations true both ways."""

from __future__ import annotations

import pytest
import torch

from fedray.algorithms import ALGORITHMS
from fedray.config import ConfigError, from_dict
from fedray.models import FedModel, MODELS
from fedray.models.registry import register_model
from fedray.plugins import check_data_fit, check_registries
from tests.helpers import run_quiet, small_config

OWNER = "tests.algorithms.plain_models"


class Features(torch.nn.Module):
    def __init__(self, d: int):
        super().__init__()
        self.fc = torch.nn.Linear(d, 16)

    def forward(self, x):
        return torch.relu(self.fc(x.flatten(1)))


class Plain(torch.nn.Module):
    """What a user writes: a plain module whose forward gives the logits."""

    def __init__(self, d: int, c: int):
        super().__init__()
        self.body, self.head = Features(d), torch.nn.Linear(16, c)

    def forward(self, x):
        return self.head(self.body(x))


def _dim(inp) -> int:
    return inp.input_dim or inp.in_channels * inp.height * inp.width


@pytest.fixture(scope="module", autouse=True)
def plain_models():
    register_model("fr_plain", lambda inp, nc: Plain(_dim(inp), nc), module=OWNER)
    register_model("fr_wrapped", lambda inp, nc: FedModel.wrap(Features(_dim(inp)), torch.nn.Linear(16, nc)),
                   module=OWNER)
    yield
    MODELS._remove_owned_by(OWNER)


def _config(tmp_path, partition_cache, algorithm: str, model: str) -> dict:
    return small_config(tmp_path, partition_cache, algorithm__name=algorithm, model__name=model,
                        data__source="digits", train__rounds=1, train__clients_per_round=2,
                        data__partition={"name": "iid", "num_clients": 20, "params": {}})


def _meta(cfg: dict):
    from fedray.driver.setup import prepare_data

    return prepare_data(from_dict(cfg), lambda *a: None)[1].meta


NEEDS_NOTHING = sorted(n for n, c in ALGORITHMS.items() if not c.model_needs and not n.startswith("fr_"))
NEEDS_SOMETHING = sorted(n for n, c in ALGORITHMS.items() if c.model_needs)


def test_the_declarations_cover_the_families():
    assert {"fedavg", "fedprox", "fedlc", "feddyn"} <= set(NEEDS_NOTHING)
    assert {"fedrcl", "moon", "fedproto", "fedccl", "scala", "fedmlb"} <= set(NEEDS_SOMETHING)
    assert all(set(c.model_needs) <= {"features", "split"} for c in ALGORITHMS.values())


@pytest.mark.parametrize("algorithm", NEEDS_NOTHING)
def test_a_plain_module_trains_with_every_algorithm_that_needs_nothing_more(tmp_path, partition_cache, algorithm):
    res = run_quiet(_config(tmp_path, partition_cache, algorithm, "fr_plain"))
    assert len(res.rounds) == 1 and res.rounds[0]["num_clients"] == 2


@pytest.mark.parametrize("algorithm", NEEDS_SOMETHING)
def test_a_plain_module_is_refused_before_any_work_naming_what_it_lacks(tmp_path, partition_cache, algorithm):
    cfg = _config(tmp_path, partition_cache, algorithm, "fr_plain")
    need = ALGORITHMS[algorithm].model_needs[0]
    word = {"features": "feature taps", "split": "split points"}[need]
    if algorithm == "fedmlb":  # its own check, at configuration time (it branches before the embedding)
        with pytest.raises(ConfigError, match="fedmlb needs a model with split points other than 'embedding'; "
                                              "model.name 'fr_plain' has"):
            check_registries(from_dict(cfg))
        return
    check_registries(from_dict(cfg))
    with pytest.raises(ConfigError, match=rf"algorithm.name: '{algorithm}' needs {word} .* which model 'fr_plain' "
                                          rf"\(plugin {OWNER}\), a Plain lacks; .*FedModel.wrap"):
        check_data_fit(from_dict(cfg), _meta(cfg))


@pytest.mark.parametrize("algorithm", NEEDS_SOMETHING)
def test_the_same_modules_wrapped_train_with_every_algorithm(tmp_path, partition_cache, algorithm):
    cfg = _config(tmp_path, partition_cache, algorithm, "fr_wrapped")
    if algorithm == "fedmlb":  # branches at the blocks before the embedding: a wrapped model has one block
        with pytest.raises(ConfigError, match="fedmlb needs a model with split points other than 'embedding'"):
            check_registries(from_dict(cfg))
        return
    assert len(run_quiet(cfg).rounds) == 1


def test_the_feature_analysis_needs_the_embedding_tap(tmp_path, partition_cache):
    cfg = _config(tmp_path, partition_cache, "fedavg", "fr_plain")
    cfg["eval"]["analysis_every"] = 1
    with pytest.raises(ConfigError, match=r"eval.analysis_every: the feature analysis needs feature taps"):
        check_data_fit(from_dict(cfg), _meta(cfg))
    cfg["model"]["name"] = "fr_wrapped"
    assert run_quiet(cfg).rounds[0]["num_clients"] == 2


def test_an_error_of_the_clients_code_stops_the_run_with_its_traceback(tmp_path, partition_cache):
    """A deterministic TypeError in a model's forward is not retried as a fault: the run stops at the first
    client, and the error names the file and line of the code that raised it."""
    from fedray.engine.dispatch import RunAborted

    def broken(inp, nc):
        model = Plain(_dim(inp), nc)
        model.forward = lambda x: model.head(x, "an extra argument")  # TypeError at the first batch
        return model

    register_model("fr_broken", broken, module=OWNER)
    cfg = _config(tmp_path, partition_cache, "fedavg", "fr_broken")
    cfg["engine"]["max_client_retries"] = 2
    with pytest.raises(RunAborted, match=r"(?s)round 1: client \d+: TypeError: .*no retry can fix it\).*"
                                         r"test_model_needs.py"):
        run_quiet(cfg)
