"""fedray.engine.programs.split_server: the split server step against loop references."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedray.config import from_dict
from fedray.engine.programs.split_server import SplitServer
from fedray.engine.split_layout import SplitLayout
from fedray.losses import label_prior, logit_adjusted_ce
from fedray.models import build_model
from tests.helpers import small_config
TINY_ALEXNET = {"channels": [4, 8, 8, 8, 8], "fc": [16, 16]}


def _tiny_model(seed=0, **opts):
    torch.manual_seed(seed)
    return build_model("alexnet_split", in_channels=1, image_size=28, num_classes=10, **{**TINY_ALEXNET, **opts})


def _server_fixture(name, sizes=(6, 10), seed=1, params=None):
    from fedray.algorithms import build_algorithm

    cfg = from_dict(small_config(Path("/unused"), Path("/unused"), algorithm={"name": name}, train__lr=0.1,
                                 model={"name": "alexnet_split"}))
    algo = build_algorithm(name, params or {}, cfg)
    model = _tiny_model(seed, dropout=0.0)
    lay = SplitLayout(model, "block2")
    from fedray.core.weights import flatten

    w = flatten(model)
    srv = SplitServer(model, lay, algo, cfg.train, seed=0, device="cpu")
    g = torch.Generator().manual_seed(seed)
    acts = [torch.randn(n, 8, 7, 7, generator=g) for n in sizes]
    labels = [torch.randint(0, 10, (n,), generator=g) for n in sizes]
    return algo, model, lay, w, srv, acts, labels


def _manual_step(model, lay, w, a, y, lr, loss_fn):
    """w' (full vector) after one plain SGD step of the server part (module parameters, not views)."""
    from fedray.core.weights import flatten, load_flat

    load_flat(model, w)
    _, server = model.split("block2")
    params = list(server.parameters())
    loss = loss_fn(server(a), y)
    gs = torch.autograd.grad(loss, params)
    with torch.no_grad():
        for p, gp in zip(params, gs):
            p -= lr * gp
    return flatten(model)


def test_scala_has_one_server_model_and_splitfed_v1_averages_copies():
    from fedray.algorithms.split import SplitBatch

    for name in ("scala", "splitfed_v1", "splitfed_v2"):
        algo, model, lay, w, srv, acts, labels = _server_fixture(name)
        weights = [6.0, 10.0]
        st, sf = lay.server_vectors(w)
        srv.begin_round(1, st, sf, 0.1, None, weights if algo.shape.server_copies else None)
        srv.begin_iteration(0)
        batch = SplitBatch([0, 1], [3, 4], acts, labels, np.ones((2, 10)), 10)
        res = algo.server_iteration(srv, batch)
        out, _, opt_state = srv.end_round()
        a, y = torch.cat(acts), torch.cat(labels)
        if name == "scala":
            assert srv.copies == [] and opt_state is not None
            expect = _manual_step(model, lay, w, a, y, 0.1,
                                  lambda z, t: logit_adjusted_ce(z, t, label_prior(t, 10)))
            assert [g.shape[0] for g in res.grads] == [6, 10]
        elif name == "splitfed_v1":
            assert len(srv.copies) == 2 and opt_state is None
            w_a = _manual_step(model, lay, w, acts[0], labels[0], 0.1, F.cross_entropy)
            w_b = _manual_step(model, lay, w, acts[1], labels[1], 0.1, F.cross_entropy)
            expect = w_a * (6 / 16) + w_b * (10 / 16)
        else:  # v2: one model, sequential over clients in the round's order
            order = srv.client_order(2)
            w_seq = w
            for k in order:
                w_seq = _manual_step(model, lay, w_seq, acts[k], labels[k], 0.1, F.cross_entropy)
            expect = w_seq
            assert srv.copies == []
        np.testing.assert_allclose(out, expect[lay.server_train], rtol=1e-5, atol=1e-6)


def _loop_adjusted_ce_row(z, y, prior, eps, zero_mode):
    """-log softmax(z + log P)_y for one row, with a Python loop over classes (SCALA's logit adjustment)."""
    terms = []
    for c in range(z.shape[0]):
        if zero_mode == "exclude" and prior[c] == 0 and c != y:
            continue
        terms.append((c, z[c] + math.log(max(float(prior[c]), eps))))
    log_norm = torch.logsumexp(torch.stack([t for _, t in terms]), 0)
    return log_norm - dict(terms)[y]


@pytest.mark.parametrize("opts", [{}, {"grad_scale": "concat"}, {"zero_mode": "exclude"},
                                  {"server_prior": "clients"}])
def test_scala_rows_and_server_step_match_a_loop_reference_with_skewed_client_priors(opts):
    """Two clients with different local label distributions (P_k != P_s, zero frequencies included): each
    client's gradient rows are d/dA of (1/sum B_j) sum_i CE(z_i + log P_k(i)) at the pre-step server weights
    (x sum B_j / B_k with the default grad_scale: client), and the server steps on CE(z + log P_s), P_s the concatenated
    batch's label frequencies (or the clients' summed counts with server_prior: clients)."""
    from fedray.algorithms.split import SplitBatch
    from fedray.core.weights import load_flat

    algo, model, lay, w, srv, acts, labels = _server_fixture("scala", params=opts)
    counts = np.zeros((2, 10))
    counts[0, [1, 3, 5]] = [30, 5, 1]  # client 0 holds three classes, client 1 seven; neither has all ten
    counts[1, 2:9] = [4, 8, 15, 16, 23, 42, 2]
    labels = [torch.tensor([1, 3, 5, 1, 1, 3]), torch.tensor([2, 3, 4, 5, 6, 7, 8, 8, 4, 2])]
    eps, zm = 1e-9, opts.get("zero_mode", "clamp")
    st, sf = lay.server_vectors(w)
    srv.begin_round(1, st, sf, 0.1, None, None)
    srv.begin_iteration(0)
    res = algo.server_iteration(srv, SplitBatch([0, 1], [3, 4], acts, labels, counts, 10))
    out, _, _ = srv.end_round()

    load_flat(model, w)  # the reference, at the pre-step server weights
    _, server = model.split("block2")
    a = torch.cat(acts).detach().requires_grad_(True)
    y = torch.cat(labels)
    z = server(a)
    owner = [0] * 6 + [1] * 10
    total = sum(_loop_adjusted_ce_row(z[i], int(y[i]), counts[owner[i]] / counts[owner[i]].sum(), eps, zm)
                for i in range(16)) / 16
    (ga,) = torch.autograd.grad(total, (a,))
    want = [ga[:6], ga[6:]]
    if opts.get("grad_scale", "client") == "client":
        want = [want[0] * 16 / 6, want[1] * 16 / 10]
    for got, ref in zip(res.grads, want):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-7)
    p_s = (counts.sum(0) / counts.sum() if opts.get("server_prior") == "clients"
           else np.bincount(y.numpy(), minlength=10) / 16.0)
    expect = _manual_step(model, lay, w, torch.cat(acts), y, 0.1, lambda zz, t: torch.stack(
        [_loop_adjusted_ce_row(zz[i], int(t[i]), p_s, eps, zm) for i in range(t.shape[0])]).mean())
    np.testing.assert_allclose(out, expect[lay.server_train], rtol=1e-5, atol=1e-6)


def test_scala_default_client_gradients_are_eq8_per_client_losses():
    """Eq. 8: client k receives G_k = d/dA_k of its *own* logit-adjusted loss, (1/B_k) sum over its B_k rows
    of CE(z_i + log P_k), at the pre-step server weights. The naive reference runs the server part on each
    client's activations alone, one client at a time. The default (grad_scale: client) matches it; the old
    default (concat) is B_k / sum B_j of it and fails the same check."""
    from fedray.algorithms.split import SplitBatch
    from fedray.core.weights import load_flat

    sizes = (3, 9, 4)
    g = torch.Generator().manual_seed(7)
    acts = [torch.randn(n, 8, 7, 7, generator=g) for n in sizes]
    labels = [torch.randint(0, 10, (n,), generator=g) for n in sizes]
    counts = torch.randint(0, 20, (3, 10), generator=g).numpy().astype(np.float64)
    counts[:, 0] += 1  # every client holds something

    def run(params):
        algo, model, lay, w, srv, _, _ = _server_fixture("scala", sizes=sizes, params=params)
        st, sf = lay.server_vectors(w)
        srv.begin_round(1, st, sf, 0.1, None, None)
        srv.begin_iteration(0)
        res = algo.server_iteration(srv, SplitBatch([0, 1, 2], [5, 6, 7], acts, labels, counts, 10))
        return res.grads, model, w

    got, model, w = run({})
    load_flat(model, w)
    _, server = model.split("block2")
    for k in range(3):
        a_k = acts[k].clone().requires_grad_(True)
        z_k = server(a_k)
        p_k = counts[k] / counts[k].sum()
        loss_k = sum(_loop_adjusted_ce_row(z_k[i], int(labels[k][i]), p_k, 1e-9, "clamp")
                     for i in range(sizes[k])) / sizes[k]
        (g_k,) = torch.autograd.grad(loss_k, (a_k,))
        torch.testing.assert_close(got[k], g_k, rtol=1e-5, atol=1e-7)
        old, _, _ = run({"grad_scale": "concat"})
        assert not torch.allclose(old[k], g_k, rtol=1e-3, atol=1e-7)
        torch.testing.assert_close(old[k], g_k * sizes[k] / sum(sizes), rtol=1e-5, atol=1e-7)


def test_split_methods_refuse_train_local_steps():
    """Split methods count local iterations in algorithm.params.local_iters; train.local_steps is refused by name."""
    from fedray.algorithms import build_algorithm
    from fedray.config import ConfigError

    cfg = from_dict(small_config(Path("/unused"), Path("/unused"), algorithm={"name": "scala"},
                                 model={"name": "alexnet_split"}, train__local_steps=3))
    with pytest.raises(ConfigError, match=r"train.local_steps: not used by the split program .*local_iters"):
        build_algorithm("scala", {}, cfg)
