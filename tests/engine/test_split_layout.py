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


# ------------------------------------------------------------------------------------ the shared plan
def test_the_split_plan_is_the_same_on_both_sides_and_its_wire_format_round_trips():
    """SplitPlan.build is what the coordinator's program and each worker's runtime call: the same cut, layout,
    activation shape and auxiliary head for the same model; a client vector written back restores the weights."""
    from types import SimpleNamespace

    from fedray.algorithms import build_algorithm
    from fedray.engine.split_layout import SplitPlan

    meta = SimpleNamespace(shape=(1, 28, 28), num_classes=10)
    algo = build_algorithm("sfl_local_loss", {"batch_size": 40, "local_iters": 2})
    a, b = SplitPlan.build(algo, _tiny_model(), meta), SplitPlan.build(algo, _tiny_model(), meta)
    assert (a.point, a.act_shape, a.aux_entries, a.num_train) == (b.point, b.act_shape, b.aux_entries, b.num_train)
    assert a.act_shape == client_output_shape(_tiny_model(), a.point, meta) and a.aux_size > 0
    assert a.num_train == a.layout.client_train.size + a.aux_size
    full = np.arange(a.layout.size, dtype=np.float32)
    aux = -np.arange(1, a.aux_size + 1, dtype=np.float32)
    vec = a.client_vector(full, aux)
    train, fixed = a.unpack(vec)
    assert np.array_equal(train[a.layout.client_train.size:], aux) and fixed.size == a.layout.client_fixed.size
    out = np.zeros_like(full)
    back = a.write(out, vec, full[a.layout.server_train], full[a.layout.server_fixed])
    assert np.array_equal(out, full) and np.array_equal(back, aux)
    scala = SplitPlan.build(build_algorithm("scala", {"batch_size": 40, "local_iters": 2}), _tiny_model(), meta)
    assert scala.aux is None and scala.aux_size == 0 and scala.num_train == scala.layout.client_train.size
