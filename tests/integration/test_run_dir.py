"""Nothing written is lost: an existing run is never clobbered, resume trusts checkpoints/latest only and
refuses to start over silently, checkpoints hold no pickle (reliability issue, items 3 and 5)."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from fedray.config import ConfigError, from_dict
from fedray.core.checkpoint import CheckpointError
from fedray.driver.runner import run_experiment
from fedray.reporting.rundir import RunDir
from tests.helpers import small_config

QUIET = {"log": lambda *a: None}


def _cfg(tmp_path, partition_cache, **over):
    return from_dict(small_config(tmp_path, partition_cache, **{"train__rounds": 2, **over}))


def test_a_second_run_into_the_same_directory_is_refused(tmp_path, partition_cache):
    first = run_experiment(_cfg(tmp_path, partition_cache), **QUIET)
    rows = RunDir(first.run_dir).read_metrics()
    with pytest.raises(ConfigError, match=r"^output: .* already holds a run \(status finished\).*--resume.*--overwrite"):
        run_experiment(_cfg(tmp_path, partition_cache), **QUIET)
    assert RunDir(first.run_dir).read_metrics() == rows  # untouched
    again = run_experiment(_cfg(tmp_path, partition_cache), overwrite=True, **QUIET)
    assert again.weights_hash == first.weights_hash and len(again.rounds) == 2


def test_resume_trusts_latest_and_never_a_stale_checkpoint(tmp_path, partition_cache):
    res = run_experiment(_cfg(tmp_path, partition_cache, train__rounds=3, output__keep_checkpoints=3), **QUIET)
    rd = RunDir(res.run_dir)
    ckpts = rd.path / "checkpoints"
    (ckpts / "ckpt-000009.npz").write_bytes((ckpts / "ckpt-000003.npz").read_bytes())  # stray, not `latest`
    (ckpts / "latest").write_text("ckpt-000002.npz\n")
    assert rd.load_checkpoint()["round"] == 2
    (ckpts / "latest").write_text("ckpt-000007.npz\n")
    with pytest.raises(CheckpointError, match="ckpt-000007.npz"):
        rd.load_checkpoint()


def test_resume_without_a_readable_checkpoint_refuses(tmp_path, partition_cache):
    res = run_experiment(_cfg(tmp_path, partition_cache), **QUIET)
    rd = RunDir(res.run_dir)
    rows = rd.read_metrics()
    latest = rd.path / "checkpoints" / "latest"
    (rd.path / "checkpoints" / latest.read_text().strip()).write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="unreadable checkpoint"):
        run_experiment(resume=rd.path, **QUIET)
    latest.unlink()
    with pytest.raises(ConfigError, match=r"no checkpoint .* 2 recorded rounds .*--overwrite"):
        run_experiment(resume=rd.path, **QUIET)
    assert rd.read_metrics() == rows  # nothing truncated


def test_a_planted_pickle_is_never_executed(tmp_path, partition_cache):
    res = run_experiment(_cfg(tmp_path, partition_cache), **QUIET)
    rd = RunDir(res.run_dir)
    marker = tmp_path / "pwned"

    class Boom:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    name = (rd.path / "checkpoints" / "latest").read_text().strip()
    (rd.path / "checkpoints" / name).write_bytes(pickle.dumps({"round": 2, "weights": Boom()}))
    with pytest.raises(CheckpointError):
        rd.load_checkpoint()
    np.savez(rd.path / "checkpoints" / name, __tree__=np.array([Boom()], dtype=object))
    with pytest.raises(CheckpointError):
        rd.load_checkpoint()
    assert not marker.exists()


def test_checkpoints_round_trip_exactly_without_pickle(tmp_path):
    rd = RunDir(tmp_path / "r").create()
    state = {"round": 4, "weights": np.linspace(0, 1, 7, dtype=np.float32), "ema": 0.1 + 0.2,
             "server_opt": {"m": np.ones(3, np.float32)},
             "algorithm_state": {"clients": {3: {"signals": np.eye(2), "labels": np.arange(2)}}, "aux": None,
                                 "bytes": {"round": 4, "upload": 10}, "t": (1, "a"), "x": np.float32(0.25),
                                 "nan": float("nan")}}
    rd.save_checkpoint(state)
    got = rd.load_checkpoint()
    assert got["ema"] == state["ema"] and got["weights"].tobytes() == state["weights"].tobytes()
    assert list(got["algorithm_state"]["clients"]) == [3] and got["algorithm_state"]["t"] == (1, "a")
    assert got["algorithm_state"]["x"].dtype == np.float32 and np.isnan(got["algorithm_state"]["nan"])
    with np.load(rd.checkpoint_path(4), allow_pickle=False) as z:
        assert json.loads(z["__tree__"].tobytes())  # plain JSON + arrays
