"""fedray.reporting.rundir: the run directory's checkpoints and TensorBoard event files."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from fedray.reporting.rundir import RunDir


def test_checkpoint_write_is_atomic(tmp_path, monkeypatch):
    rd = RunDir(tmp_path / "run").create()
    rd.save_checkpoint({"round": 1, "weights": np.arange(4, dtype=np.float32)})
    import fedray.reporting.rundir as rdmod

    real = rdmod.os.replace

    def crash(src, dst):
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(rdmod.os, "replace", crash)
    with pytest.raises(OSError):
        rd.save_checkpoint({"round": 2, "weights": np.ones(4, dtype=np.float32)})
    monkeypatch.setattr(rdmod.os, "replace", real)
    st = rd.load_checkpoint()
    assert st["round"] == 1 and np.array_equal(st["weights"], np.arange(4, dtype=np.float32))
    assert not [p for p in (rd.path / "checkpoints").iterdir() if p.name.endswith(".tmp")]
    # a torn newest checkpoint falls back to the previous one
    (rd.path / "checkpoints" / "ckpt-000003.pkl").write_bytes(pickle.dumps({"round": 3})[:5])
    assert rd.load_checkpoint()["round"] == 1


def test_tensorboard_logger_writes_every_number_of_each_round(tmp_path):
    """The event files read back with TensorBoard's own reader: one scalar per numeric field (nested ones as
    ``group/key``) at the round as the step; no torch needed to write them (a Ray run's driver has none)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from fedray.reporting.rundir import TensorBoardLogger

    tb = TensorBoardLogger(tmp_path / "tb")
    rows = [{"round": 1, "loss": 2.5, "accuracy": None, "seconds": {"train": 0.5, "eval": 0.25}, "note": "x"},
            {"round": 2, "loss": 1.75, "accuracy": 0.5, "seconds": {"train": 0.4, "eval": 0.125}}]
    for row in rows:
        tb.log(row)
    tb.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert sorted(acc.Tags()["scalars"]) == ["accuracy", "loss", "seconds/eval", "seconds/train"]
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 2.5), (2, 1.75)]
    assert [(e.step, e.value) for e in acc.Scalars("accuracy")] == [(2, 0.5)]
    assert [(e.step, e.value) for e in acc.Scalars("seconds/eval")] == [(1, 0.25), (2, 0.125)]
