"""fedray.data.loader: float conversion, batch iteration, augmentation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedray.data.loader import Augment, iterate_batches, to_float, train_batch, train_batches
from fedray.data.table import DataError, DatasetMeta


# ---------------------------------------------------------------------------------------------
# loader


def test_to_float_bit_exact_and_normalize():
    meta = DatasetMeta("toy", 10, (1, 4, 4), mean=(0.5,), std=(0.25,))
    x = np.arange(256, dtype=np.uint8).reshape(16, 1, 4, 4)
    got = to_float(torch.from_numpy(x), meta, normalize=False)
    ref = x.astype(np.float32) / np.float32(255.0)
    assert got.dtype == torch.float32 and np.array_equal(got.numpy().view(np.uint32), ref.view(np.uint32))
    norm = to_float(torch.from_numpy(x), meta, normalize=True)
    assert torch.allclose(norm, (torch.from_numpy(ref) - 0.5) / 0.25)
    f = torch.rand(3, 1, 4, 4)
    assert to_float(f, meta, normalize=False) is f
    rgb = DatasetMeta("rgb", 10, (3, 4, 4), mean=(0.5, 0.4), std=(0.2, 0.2))
    with pytest.raises(DataError, match="channels"):
        to_float(torch.zeros(2, 3, 4, 4), rgb, normalize=True)


def test_train_batch_converts_then_augments_with_the_generator_on_the_cpu():
    meta = DatasetMeta("toy", 10, (1, 4, 4), mean=(0.5,), std=(0.25,))
    x = torch.from_numpy(np.arange(64, dtype=np.uint8).reshape(4, 1, 4, 4))
    cpu = torch.device("cpu")
    plain = train_batch(x, meta, True, cpu)
    assert torch.equal(plain, to_float(x, meta, True))
    aug = Augment(crop_pad=1, flip=True)
    got = train_batch(x, meta, True, cpu, aug, torch.Generator().manual_seed(3))
    ref = aug(to_float(x, meta, True), torch.Generator().manual_seed(3))
    assert got.dtype == torch.float32 and torch.equal(got, ref)
    assert not torch.equal(got, plain)  # the augmentation ran


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_train_batches_gathered_on_the_device_equal_those_copied_per_batch(dtype):
    meta = DatasetMeta("toy", 10, (1, 3, 3), mean=(0.5,), std=(0.25,))
    rng = np.random.default_rng(0)
    images = (rng.integers(0, 256, (23, 1, 3, 3)) if dtype == np.uint8 else rng.random((23, 1, 3, 3))).astype(dtype)
    labels = rng.integers(0, 10, 23).astype(np.int64)
    schedule = [rng.permutation(23)[:10], rng.permutation(23)[:7], np.array([3, 3, 0])]
    cpu = torch.device("cpu")
    per_batch = list(train_batches(images, labels, schedule, meta, True, cpu, resident=False))
    gathered = list(train_batches(images, labels, schedule, meta, True, cpu, resident=True))
    assert len(per_batch) == len(gathered) == 3
    for (x1, y1), (x2, y2), idx in zip(per_batch, gathered, schedule):
        assert torch.equal(x1, x2) and torch.equal(y1, y2) and x2.dtype == torch.float32
        assert torch.equal(x1, to_float(torch.from_numpy(images[idx]), meta, True))
    assert list(train_batches(images, labels, [], meta, True, cpu, resident=True)) == []
    with pytest.raises(ValueError, match="augmented"):
        list(train_batches(images, labels, schedule, meta, True, cpu, Augment(flip=True), resident=True))


def test_iterate_batches_order_and_sizes():
    meta = DatasetMeta("toy", 10, (1, 2, 2))
    images = np.arange(23 * 4, dtype=np.uint8).reshape(23, 1, 2, 2)
    labels = np.arange(23, dtype=np.int64) % 10
    perm = np.random.default_rng([0, 1, 2]).permutation(23)
    batches = list(iterate_batches(images, labels, perm, 10, meta=meta, normalize=False))
    assert [len(y) for _, y in batches] == [10, 10, 3]
    for i, (x, y) in enumerate(batches):
        idx = perm[i * 10 : (i + 1) * 10]
        assert y.dtype == torch.int64 and torch.equal(y, torch.from_numpy(labels[idx]))
        assert torch.equal(x, torch.from_numpy(images[idx]).float() / 255.0)
    assert [len(y) for _, y in iterate_batches(images, labels, perm, 10, meta=meta, normalize=False, drop_last=True)] == [10, 10]
    with pytest.raises(DataError, match="generator"):
        next(iterate_batches(images, labels, perm, 10, meta=meta, normalize=False, augment=Augment(flip=True)))


def test_augment_deterministic_and_correct():
    x = torch.rand(8, 3, 12, 10)
    aug = Augment(crop_pad=3, flip=True, rotate_deg=15)
    a = aug(x, torch.Generator().manual_seed(5))
    b = aug(x, torch.Generator().manual_seed(5))
    c = aug(x, torch.Generator().manual_seed(6))
    assert a.shape == x.shape and torch.equal(a, b) and not torch.equal(a, c)
    # crop only: every output is a window of the zero-padded input at the drawn offsets
    g = torch.Generator().manual_seed(1)
    crop = Augment(crop_pad=2)(x, g)
    off = torch.randint(0, 5, (2, 8), generator=torch.Generator().manual_seed(1))
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for i in range(8):
        assert torch.equal(crop[i], padded[i, :, off[0, i] : off[0, i] + 12, off[1, i] : off[1, i] + 10])
    # flip only: each image is either unchanged or mirrored, and both happen
    fl = Augment(flip=True)(x, torch.Generator().manual_seed(0))
    same = [torch.equal(fl[i], x[i]) for i in range(8)]
    assert all(s or torch.equal(fl[i], x[i].flip(-1)) for i, s in enumerate(same)) and 0 < sum(same) < 8
    # a near-zero rotation is the identity up to rounding
    rot = Augment(rotate_deg=1e-6)(x, torch.Generator().manual_seed(0))
    assert torch.allclose(rot, x, atol=1e-5)
    assert Augment()(x, torch.Generator()) is x


def test_augment_from_spec():
    assert Augment.from_spec(["crop", "flip", "rotate"]) == Augment(4, True, 10.0)
    assert Augment.from_spec({"crop": 2, "flip": True, "rotate": 5}) == Augment(2, True, 5.0)
    assert Augment.from_spec("crop,flip") == Augment(4, True, 0.0)
    assert not Augment.from_spec(None) and not Augment.from_spec("none") and not Augment.from_spec([])
    with pytest.raises(DataError, match="'cutout'"):
        Augment.from_spec(["crop", "cutout"])
    with pytest.raises(DataError, match="'blur'"):
        Augment.from_spec({"blur": 1})
    with pytest.raises(DataError, match="crop"):
        Augment.from_spec({"crop": -1})
