"""The ordered fold (fedray.engine.fold): bit-identical whatever the arrival order."""

from __future__ import annotations

import numpy as np
import pytest

from fedray.engine.fold import OrderedFold


def _vectors(n, d=257, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(d).astype(np.float32) for _ in range(n)], [float(w) for w in rng.integers(1, 50, n)]


def _naive(vecs, weights, keep=None):
    """The fold written out: a_1 w_1, then += a_k w_k in sampled order (float32)."""
    keep = range(len(vecs)) if keep is None else keep
    total = float(sum(weights[p] for p in keep))
    acc = None
    for p in sorted(keep):
        a = weights[p] / total
        acc = vecs[p] * a if acc is None else acc + vecs[p] * a
    return acc


@pytest.mark.parametrize("seed", range(5))
def test_any_arrival_order_gives_the_same_bits(seed):
    vecs, weights = _vectors(12, seed=seed)
    ref = _naive(vecs, weights)
    order = np.random.default_rng(100 + seed).permutation(len(vecs))
    fold = OrderedFold(weights)
    folded = []
    for p in order:
        folded += [q for q, _ in fold.add(int(p), vecs[p], item=int(p))]
    assert folded == list(range(len(vecs)))  # items come back in sampled order
    assert fold.complete and fold.waiting == 0
    assert fold.result().tobytes() == ref.tobytes()


def test_results_wait_until_the_positions_before_them_are_in():
    vecs, weights = _vectors(3)
    fold = OrderedFold(weights)
    assert fold.add(2, vecs[2], "c") == [] and fold.add(1, vecs[1], "b") == []
    assert fold.waiting == 2 and fold.next == 0
    assert fold.add(0, vecs[0], "a") == [(0, "a"), (1, "b"), (2, "c")]


def test_skipped_positions_renormalise_over_the_kept_weights():
    vecs, weights = _vectors(6, seed=3)
    fold = OrderedFold(weights)
    for p in (5, 4, 1, 0):
        fold.add(p, vecs[p])
    fold.skip(3)
    assert fold.next == 2 and fold.waiting == 3  # position 2 missing: 3 (skipped), 4 and 5 wait behind it
    fold.skip(2)
    got = fold.result()
    want = _naive(vecs, weights, keep=[0, 1, 4, 5]) * np.float32(1.0)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-7)
    assert fold.kept == sum(weights[p] for p in (0, 1, 4, 5))


def test_nothing_folded_gives_none():
    fold = OrderedFold([1.0, 2.0])
    fold.skip(1)
    fold.skip(0)
    assert fold.complete and fold.result() is None


def test_scaled_fold_adds_partial_sums_in_order_and_renormalises_over_their_weights():
    """engine.fold_group: the vectors are partial sums already multiplied by a_k = weight_k / total; the fold
    adds them in position order whatever the arrival order, and ``weight=`` says what a partial sum holds."""
    rng = np.random.default_rng(4)
    client_w = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0]
    vecs = [rng.standard_normal(257).astype(np.float32) for _ in client_w]
    per_client = OrderedFold(client_w)
    a = [per_client.coefficient(p) for p in range(6)]
    parts = [vecs[0] * a[0] + vecs[1] * a[1], vecs[2] * a[2] + vecs[3] * a[3], vecs[4] * a[4] + vecs[5] * a[5]]
    fold = OrderedFold([4.0, 5.0, 14.0], total=per_client.total, scaled=True)
    for g in (2, 0, 1):
        fold.add(g, parts[g], g)
    assert np.array_equal(fold.result(), (parts[0] + parts[1]) + parts[2])
    # the middle group lost client 3 (weight 1): it holds 4.0 of its 5.0; the sum is renormalised over 22.0
    fold = OrderedFold([4.0, 5.0, 14.0], total=per_client.total, scaled=True)
    fold.add(1, vecs[2] * a[2], weight=4.0)
    fold.add(0, parts[0])
    fold.add(2, parts[2])
    expect = ((parts[0] + vecs[2] * a[2]) + parts[2]) * np.float32(23.0 / 22.0)
    assert fold.kept == 22.0 and np.array_equal(fold.result(), expect)
