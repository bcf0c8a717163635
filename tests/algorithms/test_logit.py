"""fedray.algorithms.logit: FedLogit and FedLA (logit adjustment) end to end."""

from __future__ import annotations

import math


from fedray.config import from_dict
from fedray.engine.runner import run_experiment
from tests.helpers import small_config

SPLIT_METHODS = ["scala", "splitfed_v1", "splitfed_v2", "splitfed_v3", "sfl_local_loss"]
TINY_ALEXNET = {"channels": [4, 8, 8, 8, 8], "fc": [16, 16]}
CPC = {"name": "classes_per_client", "num_clients": 100, "params": {"classes": 2}}


def _cfg(tmp_path, partition_cache, name, params=None, model_params=None, **over):
    algo_params = {"batch_size": 40, "local_iters": 2} if name in SPLIT_METHODS else {}
    algo_params.update(params or {})
    over = {"data__partition": CPC, "train__rounds": 2, "train__clients_per_round": 4, **over}
    return small_config(tmp_path, partition_cache, model={"name": "alexnet_split",
                                                          "params": {**TINY_ALEXNET, **(model_params or {})}},
                        algorithm={"name": name, "params": algo_params}, **over)


def _run(cfg: dict, **kw):
    return run_experiment(from_dict(cfg), progress=False, log=lambda *a: None, **kw)


# ------------------------------------------------------------------------------------ FL baselines
def test_fedlogit_and_fedla_train_and_seed_dropout(tmp_path, partition_cache):
    from fedray.algorithms import ALGORITHMS

    assert issubclass(ALGORITHMS["fedla"], ALGORITHMS["fedlc"])
    for name in ("fedlogit", "fedla"):
        one = _run(_cfg(tmp_path / f"{name}1", partition_cache, name))
        three = _run(_cfg(tmp_path / f"{name}3", partition_cache, name, engine__num_workers=3))
        assert one.weights_hash == three.weights_hash  # alexnet dropout is seeded per (seed, round, client)
        assert math.isfinite(one.rounds[-1]["loss"])
