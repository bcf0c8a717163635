"""fedray.data.formats: bilinear resize, cached arrays, stratified split helpers."""

from __future__ import annotations

import numpy as np
import pytest

from fedray.data.formats import bilinear_matrix, cached_arrays, resize_bilinear, stratified_split, stratified_subset

pytestmark = pytest.mark.usefixtures("_cache_dir")  # tests/data/conftest.py


def test_bilinear_matrix_half_pixel_rule():
    m = bilinear_matrix(2, 4)  # torch: [a, .75a+.25b, .25a+.75b, b]
    np.testing.assert_allclose(m, [[1, 0], [0.75, 0.25], [0.25, 0.75], [0, 1]])
    np.testing.assert_allclose(bilinear_matrix(5, 5), np.eye(5))
    np.testing.assert_allclose(bilinear_matrix(8, 28).sum(axis=1), 1.0)
    # torch.nn.functional.interpolate(x, size=(3, 7), mode="bilinear", align_corners=False), torch 2.13
    x = np.array([[0.0, 10.0, 40.0], [5.0, 100.0, 20.0]])
    ref = [[0.0, 1.4285714286, 5.7142857143, 10.0, 22.8571428571, 35.7142857143, 40.0],
           [2.5, 10.0, 32.5, 55.0, 44.2857142857, 33.5714285714, 30.0],
           [5.0, 18.5714285714, 59.2857142857, 100.0, 65.7142857143, 31.4285714286, 20.0]]
    np.testing.assert_allclose(resize_bilinear(x, (3, 7)), ref, rtol=0, atol=1e-9)


def test_cache_rebuilds_corrupt_or_failing_files(_cache_dir):
    calls = []

    def build():
        calls.append(1)
        return {"a": np.arange(5)}

    np.testing.assert_array_equal(cached_arrays("unit-test", build)["a"], np.arange(5))
    cached_arrays("unit-test", build)
    assert len(calls) == 1
    (_cache_dir / "unit-test.npz").write_bytes(b"garbage")
    np.testing.assert_array_equal(cached_arrays("unit-test", build)["a"], np.arange(5))
    cached_arrays("unit-test", build, check=lambda a: a["a"].shape == (6,))
    cached_arrays("unit-test", build, enabled=False)
    assert len(calls) == 4 and not list(_cache_dir.glob(".unit-test*"))  # no temporary files left


def test_split_helpers_are_stratified_and_fixed():
    labels = np.repeat(np.arange(3), [10, 5, 1])
    tr, te = stratified_split(labels, 0.2, 0)
    assert np.bincount(labels[te], minlength=3).tolist() == [2, 1, 0]
    assert sorted(np.concatenate([tr, te]).tolist()) == list(range(16))
    np.testing.assert_array_equal(te, stratified_split(labels, 0.2, 0)[1])
    sub = stratified_subset(labels, 8, 0)
    assert len(sub) == 8 and np.bincount(labels[sub], minlength=3).tolist() == [5, 3, 0]
    np.testing.assert_array_equal(stratified_subset(labels, 99, 0), np.arange(16))
