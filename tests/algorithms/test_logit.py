"""fedray.algorithms.logit: FedLogit and FedLA (logit adjustment) end to end."""

from __future__ import annotations

import math

from tests.helpers import run_quiet as _run, split_config as _cfg


# ------------------------------------------------------------------------------------ FL baselines
def test_fedlogit_and_fedla_train_and_seed_dropout(tmp_path, partition_cache):
    from fedray.algorithms import ALGORITHMS

    assert issubclass(ALGORITHMS["fedla"], ALGORITHMS["fedlc"])
    for name in ("fedlogit", "fedla"):
        one = _run(_cfg(tmp_path / f"{name}1", partition_cache, name))
        three = _run(_cfg(tmp_path / f"{name}3", partition_cache, name, engine__num_workers=3))
        assert one.weights_hash == three.weights_hash  # alexnet dropout is seeded per (seed, round, client)
        assert math.isfinite(one.rounds[-1]["loss"])
