"""A damaged cached partition is detected when a run starts and rebuilt from the source, so a run never
trains on a damaged block and its result equals a run on an intact cache (reliability issue, item 4)."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from fedray.config import from_dict
from fedray.data.store import PartitionStore
from fedray.driver.runner import run_experiment
from tests.helpers import small_config

SAMPLED = int(np.random.default_rng([0, 1]).choice(100, size=6, replace=False)[0])  # trained on in round 1


def _run(tmp_path, cache):
    lines = []
    cfg = small_config(tmp_path, cache, train__rounds=2)
    res = run_experiment(from_dict(cfg), log=lambda *a: lines.append(" ".join(map(str, a))), overwrite=True)
    return res, lines


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The final weights of a run on a freshly built cache, and that cache."""
    tmp = tmp_path_factory.mktemp("reference")
    res, _ = _run(tmp, tmp / "cache")
    (part,) = [p for p in (tmp / "cache").iterdir() if not p.name.startswith(".")]
    return res.weights_hash, part


@pytest.mark.parametrize("how", ["truncated", "overwritten"])
def test_a_damaged_block_is_rebuilt_before_the_run_trains(tmp_path, reference, how):
    weights, part = reference
    cache = tmp_path / "cache"
    shutil.copytree(part, cache / part.name)
    ref = PartitionStore.open(cache / part.name).block_of(SAMPLED)  # the record batch holding the client's rows
    good = ref.path.read_bytes()
    mid = ref.offset + ref.nbytes // 2
    if how == "truncated":
        ref.path.write_bytes(good[:mid])
    else:  # same size, pixels in the middle of the block changed: a size check cannot see it
        ref.path.write_bytes(good[:mid] + bytes(255 - b for b in good[mid : mid + 256]) + good[mid + 256 :])
    res, lines = _run(tmp_path, cache)
    damaged = [ln for ln in lines if "partition cache damaged" in ln]
    assert len(damaged) == 1 and str(ref.path) in damaged[0]
    if how == "overwritten":
        assert f"damaged block {ref.index} of {ref.path}" in damaged[0]
        first, last = re.search(r"clients? (\d+)(?:\.\.(\d+))?\)", damaged[0]).groups()
        assert int(first) <= SAMPLED <= int(last or first)
    assert ref.path.read_bytes() == good
    assert res.failed is None and res.weights_hash == weights


def _shrink_sizes_in_place(path) -> None:
    """Every client's ``num_samples`` in ``clients.arrow`` one lower (clients of one row kept), written into the
    file in place (same inode, as a stray writer or a bad block would): within their blocks, so each client would
    read one row fewer and weigh less, with nothing else to notice."""
    import pyarrow as pa

    mm = pa.memory_map(str(path))
    buf = mm.read_buffer()
    col = pa.ipc.open_file(buf).get_batch(0).column("num_samples")
    at = col.buffers()[1].address - buf.address
    sizes = col.to_numpy()
    new = np.where(sizes > 1, sizes - 1, sizes).astype(np.int64).tobytes()
    del col, sizes, buf
    mm.close()
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(new)


def test_a_client_index_changed_on_disk_mid_run_fails_the_run_and_the_resume_ends_with_the_intact_bits(
        tmp_path, reference):
    """Issue 34's chaos harness (seed 21 schedule 17): ``clients.arrow`` overwritten in place after round 1 of a
    run. Its processes had checked it when they mapped it, so they read the new sizes from the mapping and the run
    finished with other weights, exit 0. Now the round's check fails the run, naming the file; the resume finds
    the damage, rebuilds the partition and ends with the intact run's weights."""
    from fedray.engine.dispatch import RunAborted

    weights, part = reference
    cache = tmp_path / "cache"
    shutil.copytree(part, cache / part.name)
    index = cache / part.name / "clients.arrow"
    good = index.read_bytes()

    def on_round(report):
        if report["round"] == 1:
            _shrink_sizes_in_place(index)

    cfg = small_config(tmp_path, cache, train__rounds=2)
    with pytest.raises(RunAborted, match=r"clients.arrow changed on disk after it was checked .*\(the partition's data"):
        run_experiment(from_dict(cfg), log=lambda *a: None, on_round=on_round)
    (run_dir,) = (tmp_path / "runs").iterdir()
    info = __import__("json").loads((run_dir / "run.json").read_text())
    assert info["status"] == "failed" and "changed on disk" in info["error"]
    lines = []
    res = run_experiment(resume=run_dir, log=lambda *a: lines.append(" ".join(map(str, a))))
    assert any("partition cache damaged" in ln and str(index) in ln for ln in lines), lines
    assert index.read_bytes() == good
    assert res.failed is None and res.weights_hash == weights
