"""fedray.algorithms.server_opt: the server optimizers against numpy references of their formulas."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from fedray.algorithms.base import ClientHints
from fedray.algorithms.server_opt import build_server_optimizer
from fedray.config import from_dict
from tests.helpers import small_config


# ------------------------------------------------------------------------------------ server-side formulas
def _ref_fedavgm(ws, avgs, lr, beta):
    m, out = None, []
    for w, a in zip(ws, avgs):
        d = w - a
        m = d if m is None else beta * m + d
        out.append(w - lr * m)
    return out


def _ref_fedadam(ws, avgs, lr, b1, b2, tau):
    m, v = 0.0, tau * tau  # v starts at tau^2 (reference ServerAdam)
    out = []
    for w, a in zip(ws, avgs):
        d = a - w
        m = b1 * m + (1 - b1) * d
        v = b2 * v + (1 - b2) * d * d
        out.append(w + lr * m / (np.sqrt(v) + tau))
    return out


def _ref_fedacg(ws, avgs, lr, lam):
    """Returns (broadcast, new) per step: w_hat = w + lam*m; Delta = avg - w_hat; m = lam*m + Delta;
    w' = w_hat + lr*Delta."""
    m, out = None, []
    for w, a in zip(ws, avgs):
        w_hat = w if m is None else w + lam * m
        delta = a - w_hat
        m = delta if m is None else lam * m + delta
        out.append((w_hat, w_hat + lr * delta))
    return out


def _sequence(n=4, d=257, seed=0):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal(d).astype(np.float32)
    avgs = [(w + 0.1 * rng.standard_normal(d)).astype(np.float32) for _ in range(n)]
    return w, avgs


@pytest.mark.parametrize("name, lr, params", [("fedavgm", 1.0, {"momentum": 0.4}), ("fedavgm", 0.5, {"momentum": 0.9})])
def test_fedavgm_matches_numpy_reference(name, lr, params):
    w, avgs = _sequence()
    opt = build_server_optimizer(name, lr, params)
    ws, got = [], []
    for a in avgs:
        ws.append(w.astype(np.float64))
        w = opt.step(w, a)
        got.append(w)
    # the reference runs in float64 on the same inputs the optimizer saw
    ref = _ref_fedavgm(ws, [a.astype(np.float64) for a in avgs], lr, params["momentum"])
    for g, r in zip(got, ref):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_fedadam_matches_numpy_reference():
    w, avgs = _sequence(seed=1)
    opt = build_server_optimizer("fedadam", 0.01, {"beta1": 0.9, "beta2": 0.99, "tau": 1e-3})
    ws, got = [], []
    for a in avgs:
        ws.append(w.astype(np.float64))
        w = opt.step(w, a)
        got.append(w)
    ref = _ref_fedadam(ws, [a.astype(np.float64) for a in avgs], 0.01, 0.9, 0.99, 1e-3)
    for g, r in zip(got, ref):
        np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_server_lr_defaults_per_optimizer():
    """An unset server.lr takes the optimizer's default (FedAdam 0.01, METHODS.md); an explicit one is kept."""
    base = small_config(Path("/nonexistent"), Path("/nonexistent"))
    assert from_dict({**base, "server": {"name": "fedadam"}}).server.lr == 0.01
    assert from_dict({**base, "server": {"name": "fedavgm"}}).server.lr == 1.0
    assert from_dict({**base, "server": {"name": "fedadam", "lr": 0.1}}).server.lr == 0.1
    assert from_dict(base).server.lr == 1.0


def test_fedacg_matches_numpy_reference():
    w, avgs = _sequence(seed=2)
    opt = build_server_optimizer("fedacg", 1.0, {"lam": 0.85, "beta": 1e-3})
    assert opt.client_hints() == ClientHints(prox_mu=1e-3)
    ws, got = [], []
    for a in avgs:
        ws.append(w.astype(np.float64))
        b = opt.broadcast_weights(w)
        w = opt.step(w, a)
        got.append((b, w))
    ref = _ref_fedacg(ws, [a.astype(np.float64) for a in avgs], 1.0, 0.85)
    for (gb, gw), (rb, rw) in zip(got, ref):
        np.testing.assert_allclose(gb, rb, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(gw, rw, rtol=1e-5, atol=1e-6)
