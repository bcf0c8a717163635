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
