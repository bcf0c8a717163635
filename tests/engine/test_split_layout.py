"""fedray.engine.split_layout: batch sizes, batch plans and the split weight layout."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedray.engine.split_layout import (
    SplitLayout,
    assign_clients,
    batch_plan,
    batch_sizes,
    client_output_shape,
)
from fedray.models import build_model
TINY_ALEXNET = {"channels": [4, 8, 8, 8, 8], "fc": [16, 16]}


def _tiny_model(seed=0, **opts):
    torch.manual_seed(seed)
    return build_model("alexnet_split", in_channels=1, image_size=28, num_classes=10, **{**TINY_ALEXNET, **opts})


# ------------------------------------------------------------------------------------ plans
def test_batch_sizes_sum_to_about_b_and_follow_data_sizes():
    sizes = np.array([40, 10, 80, 5, 25, 60, 33, 47, 12, 90])
    bk = batch_sizes(sizes, 320)
    assert bk.sum() <= 320 and bk.sum() >= 320 - len(sizes)
    np.testing.assert_array_equal(bk, np.maximum(1, (320 * sizes) // sizes.sum()))
    order = np.argsort(sizes, kind="stable")
    assert np.all(np.diff(bk[order]) >= 0)  # monotone in |D_k|
    assert batch_sizes([1000, 1], 10).tolist() == [9, 1]  # at least one sample each
    assert batch_sizes([3, 5], 320).tolist() == [3, 5]  # capped at |D_k|
    with pytest.raises(ValueError, match="batch_size"):
        batch_sizes([3, 5], 0)


def test_batch_plan_is_deterministic_and_never_repeats_within_an_epoch():
    a = batch_plan(np.random.default_rng([0, 1, 7]), 10, 4, 5)
    b = batch_plan(np.random.default_rng([0, 1, 7]), 10, 4, 5)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert [len(x) for x in a] == [4] * 5
    assert len(set(np.concatenate(a[:2]).tolist())) == 8  # two batches of one permutation are disjoint
    groups = assign_clients([5, 9, 1, 7, 3], 2)
    assert sorted(p for ps in groups.values() for p in ps) == [0, 1, 2, 3, 4]
    assert assign_clients([5, 9], 8).keys() == {0, 1}


def test_split_layout_partitions_the_weight_vector():
    model = _tiny_model()
    lay = SplitLayout(model, "block2")
    every = np.concatenate([lay.client_train, lay.client_fixed, lay.server_train, lay.server_fixed])
    assert np.array_equal(np.sort(every), np.arange(lay.size))
    assert {e.name for e in lay.ct_entries} == {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias"}
    assert client_output_shape(model, "block2", type("M", (), {"shape": (1, 28, 28)})) == (8, 7, 7)
