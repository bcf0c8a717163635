"""fedray.reporting.rundir: the run directory's checkpoints."""

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
