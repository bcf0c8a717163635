"""Checkpoints (fedray/core/checkpoint.py): per-client records are packed into a few arrays and read back as the
same dict of dicts, exactly; anything else keeps the one-entry-per-array form, which stays readable."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

import fedray.core.checkpoint as ckpt
from fedray.core.checkpoint import read_checkpoint, write_checkpoint


def _records(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    out = {}
    for c in rng.permutation(10 * n)[:n].tolist():  # ids in no order: insertion order is kept
        m = int(rng.integers(0, 4))  # a client may have no rows
        out[c] = {"signals": rng.normal(size=(m, 3)).astype(np.float32), "labels": rng.integers(0, 10, m)}
    return out


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return (isinstance(b, dict) and list(a) == list(b) and all(type(x) is type(y) for x, y in zip(a, b))
                and all(_same(a[k], b[k]) for k in a))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    return type(a) is type(b) and a == b


def _write(tmp_path, state) -> tuple[dict, int]:
    path = tmp_path / "c.npz"
    with open(path, "wb") as f:
        write_checkpoint(f, state)
    with zipfile.ZipFile(path) as z:
        return read_checkpoint(path), len(z.namelist())


def test_per_client_records_are_packed_and_read_back_exactly(tmp_path):
    state = {"round": 4, "weights": np.arange(5, dtype=np.float32),
             "algorithm_state": {"clients": _records(500), "local": None, "t": (1, "a")}}
    back, entries = _write(tmp_path, state)
    assert _same(back, state) and entries <= 10  # 1,000 arrays of records in 5 entries (+ weights and the tree)


@pytest.mark.parametrize("change", ["bool key", "numpy key", "str key", "field order", "dtype", "trailing shape",
                                    "scalar", "few"])
def test_records_that_cannot_be_packed_keep_the_entry_per_array_form(tmp_path, change):
    recs = _records(40, seed=1)
    first = next(iter(recs))
    if change == "bool key":
        recs.pop(1, None)  # True == 1: the key must not exist yet
        recs[True] = recs.pop(first)
    elif change == "numpy key":
        recs[np.int64(10**6)] = recs.pop(first)
    elif change == "str key":
        recs["x"] = recs.pop(first)
    elif change == "field order":
        recs[first] = dict(reversed(list(recs[first].items())))
    elif change == "dtype":
        recs[first]["labels"] = recs[first]["labels"].astype(np.int32)
    elif change == "trailing shape":
        recs[first]["signals"] = np.zeros((1, 4), np.float32)
    elif change == "scalar":
        recs[first]["labels"] = np.int64(3)
    else:
        recs = dict(list(recs.items())[:ckpt._PACK_MIN - 1])
    back, entries = _write(tmp_path, {"clients": recs})
    assert _same(back, {"clients": recs}) and entries > 2 * ckpt._PACK_MIN - 4


def test_a_checkpoint_written_before_packing_still_reads(tmp_path, monkeypatch):
    state = {"clients": _records(100, seed=2)}
    monkeypatch.setattr(ckpt, "_PACK_MIN", 10**9)  # the earlier writer: one entry per array
    back, entries = _write(tmp_path, state)
    assert entries > 100
    monkeypatch.undo()
    assert _same(read_checkpoint(tmp_path / "c.npz"), state)
