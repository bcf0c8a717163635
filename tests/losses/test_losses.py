"""Tests of fedray.losses against straightforward loop-based references written here (float64)."""

from __future__ import annotations

import math

import pytest
import torch

from fedray import losses as L

DT = torch.float64


# ----------------------------------------------------------------------------------------------------
# helpers
# ----------------------------------------------------------------------------------------------------


def _gen(seed):
    g = torch.Generator().manual_seed(seed)
    return g


def clustered(seed, b, d, c, spread=None):
    """Features around per-class centres with class-dependent noise (some classes tight, some loose)."""
    g = _gen(seed)
    labels = torch.randint(0, c, (b,), generator=g)
    centres = torch.randn(c, d, generator=g, dtype=DT)
    noise = torch.randn(b, d, generator=g, dtype=DT)
    if spread is None:
        spread = torch.linspace(0.05, 1.5, c, dtype=DT)
    else:
        spread = torch.full((c,), float(spread), dtype=DT)
    feats = centres[labels] + spread[labels, None] * noise * centres.norm(dim=1).mean() / math.sqrt(d)
    return feats, labels


def batches():
    """(name, features, labels) covering generic, singleton, single-class, identical and tiny batches."""
    out = []
    for seed, (b, d, c) in enumerate([(12, 8, 3), (9, 5, 4), (20, 16, 5), (7, 3, 2), (16, 6, 6)]):
        f, y = clustered(seed, b, d, c)
        out.append((f"clustered{seed}", f, y))
    g = _gen(99)
    out.append(("random", torch.randn(10, 7, generator=g, dtype=DT), torch.randint(0, 3, (10,), generator=g)))
    # singleton classes: classes 3 and 4 appear once
    f = torch.randn(8, 5, generator=g, dtype=DT)
    out.append(("singletons", f, torch.tensor([0, 0, 1, 1, 1, 3, 2, 4])))
    out.append(("all_singletons", torch.randn(5, 4, generator=g, dtype=DT), torch.arange(5)))
    out.append(("single_class", clustered(5, 9, 6, 1, spread=0.3)[0], torch.zeros(9, dtype=torch.long)))
    out.append(("single_class_loose", torch.randn(6, 4, generator=g, dtype=DT), torch.full((6,), 2)))
    same = torch.randn(1, 6, generator=g, dtype=DT).repeat(8, 1)
    out.append(("identical_2cls", same.clone(), torch.tensor([0, 0, 0, 1, 1, 1, 1, 0])))
    out.append(("identical_1cls", same.clone(), torch.zeros(8, dtype=torch.long)))
    out.append(("b1", torch.randn(1, 4, generator=g, dtype=DT), torch.tensor([3])))
    out.append(("b2_same", torch.randn(2, 4, generator=g, dtype=DT), torch.tensor([1, 1])))
    out.append(("b2_diff", torch.randn(2, 4, generator=g, dtype=DT), torch.tensor([0, 1])))
    return out


BATCHES = batches()
GENERIC = [b for b in BATCHES if not b[0].startswith("identical")]


def grads(fn, *tensors):
    ts = [t.detach().clone().requires_grad_(True) for t in tensors]
    out = fn(*ts)
    if isinstance(out, tuple):
        out = sum(out)
    g = torch.autograd.grad(out, ts, allow_unused=True)
    return out.detach(), [torch.zeros_like(t) if gi is None else gi for t, gi in zip(ts, g)]


def assert_close(a, b, rtol=1e-9, atol=1e-10):
    torch.testing.assert_close(torch.as_tensor(a, dtype=DT), torch.as_tensor(b, dtype=DT), rtol=rtol, atol=atol)


def _val(v):
    return float(v.detach()) if isinstance(v, torch.Tensor) else float(v)


def _lse(vals):
    m = max(_val(v) for v in vals)
    return m + torch.log(sum(torch.exp(v - m) for v in vals))


def _unit(v):
    return v / torch.sqrt((v * v).sum())


def _cos(a, b):
    return (a * b).sum() / (torch.sqrt((a * a).sum()) * torch.sqrt((b * b).sum()))


# ----------------------------------------------------------------------------------------------------
# 1-2. relaxed contrastive loss
# ----------------------------------------------------------------------------------------------------


def rcl_ref(features, labels, tau, lam, variant):
    """Loop reference: (mean_i SCL_i, mean_i PEN_i) as defined in METHODS.md §1."""
    b = features.shape[0]
    z = [_unit(features[i]) for i in range(b)]
    y = labels.tolist()
    scl_terms, pen_terms = [], []
    zero = features.sum() * 0
    for i in range(b):
        s = [(z[i] * z[j]).sum() for j in range(b)]
        if variant == "reference":
            pos = min((s[j] for j in range(b) if y[j] == y[i]), key=_val)
            negs = sorted((s[j] for j in range(b) if y[j] != y[i]), key=_val, reverse=True)[:2]
            logits = [pos / tau] + [n / tau for n in negs]
            scl_terms.append(_lse(logits) - pos / tau)
            others = [s[j] for j in range(b) if j != i and y[j] == y[i]]
            if others:
                m = min(others, key=_val)
                if _val(m) >= lam:
                    pen_terms.append(torch.log1p(torch.exp((m - s[i]) / tau)))
                    continue
            pen_terms.append(zero)
        else:
            pos = [j for j in range(b) if j != i and y[j] == y[i]]
            if pos:
                den = _lse([s[k] / tau for k in range(b) if k != i])
                scl_terms.append(sum(den - s[j] / tau for j in pos) / len(pos))
            else:
                scl_terms.append(zero)
            p = [s[k] / tau for k in pos if _val(s[k]) > lam]
            pen_terms.append(_lse(p + [torch.tensor(1.0 / tau, dtype=DT)]) - 1.0 / tau)
    return sum(scl_terms) / b, sum(pen_terms) / b


@pytest.mark.parametrize("variant", ["reference", "paper"])
@pytest.mark.parametrize("name,feats,labels", GENERIC, ids=[b[0] for b in GENERIC])
def test_rcl_matches_loop_reference(variant, name, feats, labels):
    for tau, lam in [(0.05, 0.7), (0.1, 0.3), (0.5, -0.2)]:
        got, g_got = grads(
            lambda f: L.relaxed_contrastive_loss(f, labels, tau=tau, lam=lam, variant=variant, return_parts=True), feats
        )
        exp, g_exp = grads(lambda f: rcl_ref(f, labels, tau, lam, variant), feats)
        parts = L.relaxed_contrastive_loss(feats, labels, tau=tau, lam=lam, variant=variant, return_parts=True)
        ref_parts = rcl_ref(feats, labels, tau, lam, variant)
        assert_close(parts[0], ref_parts[0])
        assert_close(parts[1], ref_parts[1])
        assert_close(g_got[0], g_exp[0], rtol=1e-7, atol=1e-9)
        # combined value = scl + beta * pen
        for beta in (0.0, 1.0, 2.5):
            total = L.relaxed_contrastive_loss(feats, labels, tau=tau, lam=lam, beta=beta, variant=variant)
            assert_close(total, ref_parts[0] + beta * ref_parts[1])


def test_rcl_penalty_exercised_by_fixtures():
    """Guard against a vacuous comparison: the clustered fixtures do fire the penalty in both variants."""
    f, y = BATCHES[0][1], BATCHES[0][2]
    for variant in ("reference", "paper"):
        _, pen = L.relaxed_contrastive_loss(f, y, variant=variant, return_parts=True)
        assert pen > 0


@pytest.mark.parametrize("variant", ["reference", "paper"])
def test_rcl_gradcheck(variant):
    f, y = clustered(3, 7, 4, 2)
    f = f.detach().requires_grad_(True)
    assert torch.autograd.gradcheck(
        lambda x: L.relaxed_contrastive_loss(x, y, tau=0.1, lam=0.3, variant=variant), (f,), eps=1e-6, atol=1e-5
    )


@pytest.mark.parametrize("variant", ["reference", "paper"])
@pytest.mark.parametrize("name,feats,labels", BATCHES, ids=[b[0] for b in BATCHES])
def test_rcl_edge_cases_finite(variant, name, feats, labels):
    for dtype in (torch.float64, torch.float32):
        f = feats.detach().clone().to(dtype).requires_grad_(True)
        loss = L.relaxed_contrastive_loss(f, labels, tau=0.05, variant=variant)
        loss.backward()
        assert torch.isfinite(loss) and loss >= -1e-6
        assert torch.isfinite(f.grad).all()


@pytest.mark.parametrize("variant", ["reference", "paper"])
def test_rcl_single_class_and_singletons(variant):
    f = torch.randn(6, 5, dtype=DT, generator=_gen(1))
    # a single-class batch has no negatives: reference SCL is exactly 0
    scl, _ = L.relaxed_contrastive_loss(f, torch.zeros(6, dtype=torch.long), variant=variant, return_parts=True)
    if variant == "reference":
        assert float(scl) == 0.0
    # all anchors singletons: no positives, no penalty
    scl, pen = L.relaxed_contrastive_loss(f, torch.arange(6), variant=variant, return_parts=True)
    assert float(pen) == 0.0
    if variant == "paper":
        assert float(scl) == 0.0
    else:  # the positive is the anchor itself: -log(e^{1/τ}/(e^{1/τ}+Σ top-2 neg)) > 0
        assert scl > 0


def test_rcl_penalty_zero_below_threshold_and_positive_on_collapse():
    g = _gen(5)
    f = torch.randn(12, 32, dtype=DT, generator=g)  # random directions: cosines far below 0.95
    y = torch.randint(0, 3, (12,), generator=g)
    for variant in ("reference", "paper"):
        _, pen = L.relaxed_contrastive_loss(f, y, lam=0.95, variant=variant, return_parts=True)
        assert float(pen) == 0.0
    same = torch.randn(1, 8, dtype=DT, generator=g).repeat(6, 1)
    y = torch.tensor([0, 0, 0, 1, 1, 1])
    _, pen_ref = L.relaxed_contrastive_loss(same, y, variant="reference", return_parts=True)
    assert_close(pen_ref, math.log(2.0), rtol=1e-6, atol=1e-6)  # softplus(0)
    _, pen_paper = L.relaxed_contrastive_loss(same, y, variant="paper", return_parts=True)
    assert_close(pen_paper, math.log(3.0), rtol=1e-6, atol=1e-6)  # log(|P(i)| + 1), |P(i)| = 2


def test_rcl_small_tau_no_overflow():
    f, y = clustered(4, 30, 16, 4)
    for variant in ("reference", "paper"):
        x = f.float().requires_grad_(True)
        loss = L.relaxed_contrastive_loss(x, y, tau=0.005, lam=0.5, variant=variant)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(x.grad).all()


def test_rcl_scale_invariant_and_half_precision():
    f, y = clustered(6, 10, 8, 3)
    a = L.relaxed_contrastive_loss(f, y)
    assert_close(a, L.relaxed_contrastive_loss(3.7 * f, y))
    h = L.relaxed_contrastive_loss(f.to(torch.bfloat16), y)
    assert h.dtype == torch.float32 and abs(float(h) - float(a)) < 0.1 * float(a) + 0.05


def test_rcl_validation():
    f = torch.randn(4, 3)
    y = torch.tensor([0, 1, 0, 1])
    with pytest.raises(ValueError, match="variant"):
        L.relaxed_contrastive_loss(f, y, variant="textbook")
    with pytest.raises(ValueError, match="labels.*integer"):
        L.relaxed_contrastive_loss(f, y.float())
    with pytest.raises(ValueError, match="labels.*integer"):
        L.relaxed_contrastive_loss(f, y.bool())
    with pytest.raises(ValueError, match=r"labels has 3 entries.*features has 4"):
        L.relaxed_contrastive_loss(f, y[:3])
    with pytest.raises(ValueError, match="features must be 2-D"):
        L.relaxed_contrastive_loss(f[None], y)
    with pytest.raises(ValueError, match="tau"):
        L.relaxed_contrastive_loss(f, y, tau=0)
    with pytest.raises(ValueError, match="beta"):
        L.relaxed_contrastive_loss(f, y, beta=-1)
    with pytest.raises(ValueError, match="lam"):
        L.relaxed_contrastive_loss(f, y, lam=float("nan"))
    with pytest.raises(ValueError, match="empty"):
        L.relaxed_contrastive_loss(f[:0], y[:0])


@pytest.mark.parametrize("variant", ["reference", "paper"])
def test_multilevel_pools_and_averages(variant):
    g = _gen(7)
    y = torch.randint(0, 3, (10,), generator=g)
    maps = [torch.randn(10, ch, hw, hw, dtype=DT, generator=g) + 1.0 for ch, hw in [(4, 6), (6, 4), (8, 2)]]
    maps.append(clustered(8, 10, 5, 3)[0])  # a (B, D) level is used as is
    scl, pen = L.multilevel_relaxed_contrastive_loss(maps, y, tau=0.1, lam=0.2, beta=1.0, variant=variant)
    refs = [rcl_ref(m.mean(dim=(2, 3)) if m.dim() == 4 else m, y, 0.1, 0.2, variant) for m in maps]
    assert_close(scl, sum(r[0] for r in refs) / len(refs))
    assert_close(pen, sum(r[1] for r in refs) / len(refs))
    assert pen > 0
    scl0, pen0 = L.multilevel_relaxed_contrastive_loss(maps, y, tau=0.1, lam=0.2, beta=0.0, variant=variant)
    assert_close(scl0, scl)
    assert float(pen0) == 0.0
    xs = [m.clone().requires_grad_(True) for m in maps]
    s, p = L.multilevel_relaxed_contrastive_loss(xs, y, variant=variant)
    (s + p).backward()
    assert all(torch.isfinite(x.grad).all() for x in xs)


def test_multilevel_validation():
    y = torch.tensor([0, 1, 0])
    with pytest.raises(ValueError, match="feature_list is empty"):
        L.multilevel_relaxed_contrastive_loss([], y)
    with pytest.raises(ValueError, match="list/tuple"):
        L.multilevel_relaxed_contrastive_loss(torch.randn(3, 4), y)
    with pytest.raises(ValueError, match=r"feature_list\[1\] has batch size 2"):
        L.multilevel_relaxed_contrastive_loss([torch.randn(3, 4, 2, 2), torch.randn(2, 4)], y)
    with pytest.raises(ValueError, match=r"feature_list\[0\] must be"):
        L.multilevel_relaxed_contrastive_loss([torch.randn(3, 4, 2)], y)
    with pytest.raises(ValueError, match="variant"):
        L.multilevel_relaxed_contrastive_loss([torch.randn(3, 4)], y, variant="x")


# ----------------------------------------------------------------------------------------------------
# 3. SimCLR NT-Xent
# ----------------------------------------------------------------------------------------------------


def ntxent_ref(z1, z2, tau):
    u = [_unit(v) for v in torch.cat([z1, z2])]
    n = len(u)
    b = n // 2
    terms = []
    for i in range(n):
        a = (i + b) % n
        logits = [(u[i] * u[k]).sum() / tau for k in range(n) if k != i]
        terms.append(_lse(logits) - (u[i] * u[a]).sum() / tau)
    return sum(terms) / n


@pytest.mark.parametrize("seed,b,d", [(0, 1, 3), (1, 4, 5), (2, 9, 8), (3, 16, 4)])
def test_ntxent_matches_reference(seed, b, d):
    g = _gen(seed)
    z1 = torch.randn(b, d, dtype=DT, generator=g)
    z2 = z1 + 0.3 * torch.randn(b, d, dtype=DT, generator=g)
    for tau in (0.05, 0.5):
        got, gg = grads(lambda a, c: L.supcon_infonce_loss(a, c, tau), z1, z2)
        exp, ge = grads(lambda a, c: ntxent_ref(a, c, tau), z1, z2)
        assert_close(got, exp)
        assert_close(gg[0], ge[0], rtol=1e-7, atol=1e-9)
        assert_close(gg[1], ge[1], rtol=1e-7, atol=1e-9)
    same = torch.ones(5, 3, dtype=DT, requires_grad=True)
    loss = L.supcon_infonce_loss(same, same, 0.05)
    loss.backward()
    assert_close(loss, math.log(9.0))  # 2B-1 equal logits
    assert torch.isfinite(same.grad).all()
    with pytest.raises(ValueError, match="same shape"):
        L.supcon_infonce_loss(z1, z2[:, :-1] if d > 1 else z2[:0], 0.1)
    with pytest.raises(ValueError, match="tau"):
        L.supcon_infonce_loss(z1, z2, -1.0)


# ----------------------------------------------------------------------------------------------------
# 4. FedLC
# ----------------------------------------------------------------------------------------------------


def flc_ref(logits, labels, counts, tau):
    b, c = logits.shape
    terms = []
    for i in range(b):
        vals = {k: logits[i, k] - tau * float(counts[k]) ** -0.25 for k in range(c) if counts[k] > 0}
        terms.append(_lse(list(vals.values())) - vals[int(labels[i])])
    return sum(terms) / b


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_logit_calibrated_ce(seed):
    g = _gen(seed)
    b, c = 11, 6
    counts = torch.randint(0, 40, (c,), generator=g)
    counts[seed % c] = 0
    counts[(seed + 1) % c] = 1
    present = torch.nonzero(counts).flatten()
    labels = present[torch.randint(0, len(present), (b,), generator=g)]
    logits = 3 * torch.randn(b, c, dtype=DT, generator=g)
    for tau in (0.0, 1.0, 2.0):
        got, gg = grads(lambda z: L.logit_calibrated_ce(z, labels, counts, tau=tau), logits)
        exp, ge = grads(lambda z: flc_ref(z, labels, counts, tau), logits)
        assert_close(got, exp)
        assert_close(gg[0], ge[0], rtol=1e-7, atol=1e-10)
        assert torch.all(gg[0][:, counts == 0] == 0)  # excluded classes get no gradient
    # all counts positive and tau=0 is plain CE
    assert_close(L.logit_calibrated_ce(logits, labels, torch.ones(c), tau=0.0),
                 torch.nn.functional.cross_entropy(logits, labels))
    bad = labels.clone()
    bad[0] = seed % c
    with pytest.raises(ValueError, match="class_counts entry is 0"):
        L.logit_calibrated_ce(logits, bad, counts)
    with pytest.raises(ValueError, match=r"class_counts must have shape \(6,\)"):
        L.logit_calibrated_ce(logits, labels, counts[:-1])
    with pytest.raises(ValueError, match="non-negative"):
        L.logit_calibrated_ce(logits, labels, counts - 100)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 6\)"):
        L.logit_calibrated_ce(logits, labels + 10, counts)


# ----------------------------------------------------------------------------------------------------
# 5. FedNTD
# ----------------------------------------------------------------------------------------------------


def ntd_ref(logits, glogits, labels, tau):
    b, c = logits.shape
    total = 0
    for i in range(b):
        ks = [k for k in range(c) if k != int(labels[i])]
        ll = [logits[i, k] / tau for k in ks]
        gl = [glogits[i, k].detach() / tau for k in ks]
        lz, gz = _lse(ll), _lse(gl)
        for a, bb in zip(ll, gl):
            q_g = torch.exp(bb - gz)
            total = total + q_g * ((bb - gz) - (a - lz))
    return total / b * tau**2


@pytest.mark.parametrize("seed,c", [(0, 2), (1, 5), (2, 10)])
def test_not_true_distillation(seed, c):
    g = _gen(seed)
    b = 9
    logits = 2 * torch.randn(b, c, dtype=DT, generator=g)
    glog = 2 * torch.randn(b, c, dtype=DT, generator=g)
    labels = torch.randint(0, c, (b,), generator=g)
    for tau in (1.0, 3.0):
        got, gg = grads(lambda z, w: L.not_true_distillation(z, w, labels, tau=tau), logits, glog)
        exp, ge = grads(lambda z, w: ntd_ref(z, w, labels, tau), logits, glog)
        assert_close(got, exp)
        assert_close(gg[0], ge[0], rtol=1e-7, atol=1e-10)
        assert torch.all(gg[1] == 0)  # global logits are a detached target
        assert torch.all(gg[0][torch.arange(b), labels] == 0)  # true class plays no part
    if c == 2:
        assert float(L.not_true_distillation(logits, glog, labels)) == 0.0
    assert abs(float(L.not_true_distillation(logits, logits, labels))) < 1e-12
    total = L.fedntd_loss(logits, glog, labels)
    ce = torch.nn.functional.cross_entropy(logits, labels)
    assert_close(total, 0.7 * ce + 0.3 * ntd_ref(logits, glog, labels, 1.0))
    with pytest.raises(ValueError, match="global_logits must have the shape"):
        L.not_true_distillation(logits, glog[:, :1], labels)
    with pytest.raises(ValueError, match="lam"):
        L.fedntd_loss(logits, glog, labels, lam=1.5)
    with pytest.raises(ValueError, match="at least 2 classes"):
        L.not_true_distillation(logits[:, :1], glog[:, :1], torch.zeros(b, dtype=torch.long))


# ----------------------------------------------------------------------------------------------------
# 6. FedDecorr
# ----------------------------------------------------------------------------------------------------


def decorr_ref(x):
    """Pearson-correlation formulation: L = (B-1)²/B · mean_{a≠b} corr_ab²."""
    n, d = x.shape
    cols = [x[:, a] - x[:, a].mean() for a in range(d)]
    terms = []
    for a in range(d):
        for b in range(d):
            if a != b:
                r = (cols[a] * cols[b]).sum() / torch.sqrt((cols[a] ** 2).sum() * (cols[b] ** 2).sum())
                terms.append(r**2)
    return (n - 1) ** 2 / n * sum(terms) / len(terms)


@pytest.mark.parametrize("seed,n,d", [(0, 3, 3), (1, 8, 5), (2, 30, 7), (3, 5, 12)])
def test_decorrelation_loss(seed, n, d):
    g = _gen(seed)
    x = torch.randn(n, d, dtype=DT, generator=g) @ torch.randn(d, d, dtype=DT, generator=g) + 4.0
    got, gg = grads(lambda t: L.decorrelation_loss(t), x)
    exp, ge = grads(decorr_ref, x)
    assert_close(got, exp, rtol=1e-6, atol=1e-9)
    assert_close(gg[0], ge[0], rtol=1e-5, atol=1e-7)
    # two samples: every |corr| = 1 (gradient ≈ 0 up to the eps regulariser)
    assert_close(L.decorrelation_loss(100 * x[:2]), decorr_ref(x[:2]), rtol=1e-6)
    # perfectly correlated dimensions: every |corr| = 1
    col = torch.randn(n, 1, dtype=DT, generator=g)
    assert_close(L.decorrelation_loss(col.repeat(1, d) * torch.arange(1, d + 1)), (n - 1) ** 2 / n, rtol=1e-6)
    # scale/shift invariant per dimension
    assert_close(L.decorrelation_loss(3 * x - 7), got, rtol=1e-6)


def test_decorrelation_degenerate():
    x = torch.zeros(6, 4, requires_grad=True)  # dead (constant) dimensions
    loss = L.decorrelation_loss(x)
    loss.backward()
    assert float(loss.detach()) == 0.0 and torch.isfinite(x.grad).all()
    y = torch.randn(1, 4, requires_grad=True)
    loss = L.decorrelation_loss(y)
    loss.backward()
    assert float(loss.detach()) == 0.0 and torch.all(y.grad == 0)
    assert float(L.decorrelation_loss(torch.randn(5, 1))) == 0.0
    with pytest.raises(ValueError, match="features must be 2-D"):
        L.decorrelation_loss(torch.randn(5, 2, 2))


# ----------------------------------------------------------------------------------------------------
# 7. MOON
# ----------------------------------------------------------------------------------------------------


def moon_ref(z, zg, zp, T):
    terms = []
    for i in range(z.shape[0]):
        a = _cos(z[i], zg[i].detach()) / T
        b = _cos(z[i], zp[i].detach()) / T
        terms.append(-torch.log(torch.exp(a) / (torch.exp(a) + torch.exp(b))))
    return sum(terms) / len(terms)


@pytest.mark.parametrize("seed,b", [(0, 1), (1, 6), (2, 17)])
def test_model_contrastive_loss(seed, b):
    g = _gen(seed)
    z, zg, zp = (torch.randn(b, 8, dtype=DT, generator=g) for _ in range(3))
    for T in (0.5, 0.05):
        got, gg = grads(lambda a, c, e: L.model_contrastive_loss(a, c, e, T=T), z, zg, zp)
        exp, ge = grads(lambda a, c, e: moon_ref(a, c, e, T), z, zg, zp)
        assert_close(got, exp)
        assert_close(gg[0], ge[0], rtol=1e-7, atol=1e-10)
        assert torch.all(gg[1] == 0) and torch.all(gg[2] == 0)
    assert_close(L.model_contrastive_loss(z, z, z), math.log(2.0))
    with pytest.raises(ValueError, match="z_prev must have the shape"):
        L.model_contrastive_loss(z, zg, zp[:, :3])
    with pytest.raises(ValueError, match="T must"):
        L.model_contrastive_loss(z, zg, zp, T=0.0)


# ----------------------------------------------------------------------------------------------------
# 8. logit adjustment
# ----------------------------------------------------------------------------------------------------


def la_ref(logits, labels, prior, eps, mode):
    b, c = logits.shape
    terms = []
    for i in range(b):
        p = prior if prior.dim() == 1 else prior[i]
        p = p / p.sum()
        y = int(labels[i])
        vals = {}
        for k in range(c):
            if float(p[k]) > 0:
                vals[k] = logits[i, k] + math.log(float(p[k]))
            elif mode == "clamp" or k == y:
                vals[k] = logits[i, k] + math.log(eps)
        terms.append(_lse(list(vals.values())) - vals[y])
    return sum(terms) / b


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
@pytest.mark.parametrize("mode", ["clamp", "exclude"])
def test_logit_adjusted_ce(seed, mode):
    g = _gen(seed)
    b, c = 12, 7
    logits = 2 * torch.randn(b, c, dtype=DT, generator=g)
    labels = torch.randint(0, c, (b,), generator=g)
    shared = L.label_prior(labels, c).to(DT)  # zero for absent classes
    rows = torch.rand(b, c, dtype=DT, generator=g)
    rows[rows < 0.35] = 0.0
    rows[0, labels[0]] = 0.0  # a row whose own label has zero prior
    rows[1] = 0.0
    rows[1, (labels[1] + 1) % c] = 1.0
    for prior in (shared, rows, 5 * rows):  # counts (unnormalised rows) give the same loss
        got, gg = grads(lambda z: L.logit_adjusted_ce(z, labels, prior, zero_mode=mode), logits)
        exp, ge = grads(lambda z: la_ref(z, labels, prior, 1e-9, mode), logits)
        assert torch.isfinite(got) and torch.isfinite(gg[0]).all()
        assert_close(got, exp)
        assert_close(gg[0], ge[0], rtol=1e-7, atol=1e-10)
    # uniform prior: plain CE
    assert_close(L.logit_adjusted_ce(logits, labels, torch.ones(c, dtype=DT), zero_mode=mode),
                 torch.nn.functional.cross_entropy(logits, labels))


def test_logit_adjusted_validation_and_prior():
    y = torch.tensor([0, 2, 2, 3])
    assert torch.equal(L.label_prior(y, 5), torch.tensor([0.25, 0.0, 0.5, 0.25, 0.0]))
    z = torch.randn(4, 5)
    with pytest.raises(ValueError, match="zero_mode"):
        L.logit_adjusted_ce(z, y, torch.ones(5), zero_mode="drop")
    with pytest.raises(ValueError, match=r"prior must have shape \(5,\) or \(4, 5\)"):
        L.logit_adjusted_ce(z, y, torch.ones(3, 5))
    with pytest.raises(ValueError, match="positive sum"):
        L.logit_adjusted_ce(z, y, torch.zeros(5))
    with pytest.raises(ValueError, match="eps"):
        L.logit_adjusted_ce(z, y, torch.ones(5), eps=0.0)
    with pytest.raises(ValueError, match="labels must have an integer dtype"):
        L.logit_adjusted_ce(z, y.float(), torch.ones(5))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        L.label_prior(y, 3)
    with pytest.raises(ValueError, match="num_classes"):
        L.label_prior(y, 0)
    # an integer count vector is accepted as a prior
    assert torch.isfinite(L.logit_adjusted_ce(z, y, torch.tensor([1, 0, 2, 1, 0])))


# ----------------------------------------------------------------------------------------------------
# 9. FedCCL / FPL / FedProc
# ----------------------------------------------------------------------------------------------------


def contrast_ref(f, y, sig, sig_y, tau):
    b = f.shape[0]
    total = f.sum() * 0
    for i in range(b):
        pos = [j for j in range(sig.shape[0]) if int(sig_y[j]) == int(y[i])]
        if not pos:
            continue
        sims = [_cos(f[i], sig[j].detach()) / tau for j in range(sig.shape[0])]
        total = total + _lse(sims) - _lse([sims[j] for j in pos])
    return total / b


def _signals(seed, d, classes, per_class):
    g = _gen(seed)
    labs = torch.tensor([c for c in classes for _ in range(per_class)], dtype=torch.long)
    return torch.randn(len(labs), d, dtype=DT, generator=g), labs


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "fn,tau,per_class",
    [
        (L.cluster_contrast_local, 0.07, 3),
        (L.cluster_contrast_global, 0.07, 1),
        (L.fpl_infonce_loss, 0.02, 2),
        (L.prototype_contrast_loss, 1.0, 1),
    ],
    ids=["local", "global", "fpl", "fedproc"],
)
def test_signal_contrast_losses(seed, fn, tau, per_class):
    g = _gen(seed + 10)
    b, d = 13, 6
    feats = torch.randn(b, d, dtype=DT, generator=g)
    labels = torch.randint(0, 5, (b,), generator=g)
    sig, sig_y = _signals(seed, d, [0, 1, 3, 6], per_class)  # classes 2 and 4 have no signal
    got, gg = grads(lambda f, s: fn(f, labels, s, sig_y, tau=tau), feats, sig)
    exp, ge = grads(lambda f, s: contrast_ref(f, labels, s, sig_y, tau), feats, sig)
    assert_close(got, exp)
    assert_close(gg[0], ge[0], rtol=1e-7, atol=1e-10)
    assert torch.all(gg[1] == 0)  # signals/prototypes are constants
    no_sig = (labels == 2) | (labels == 4)
    assert torch.all(gg[0][no_sig] == 0)
    # no signal at all (first round): zero, still differentiable
    x = feats.clone().requires_grad_(True)
    zero = fn(x, labels, sig[:0], sig_y[:0], tau=tau)
    zero.backward()
    assert float(zero.detach()) == 0.0 and torch.all(x.grad == 0)
    # no sample has a signal of its class: zero
    assert float(fn(feats, torch.full((b,), 9), sig, sig_y, tau=tau)) == 0.0
    with pytest.raises(ValueError, match="feature dimension 6"):
        fn(feats, labels, sig[:, :4], sig_y, tau=tau)
    with pytest.raises(ValueError, match="integer dtype"):
        fn(feats, labels, sig, sig_y.float(), tau=tau)
    with pytest.raises(ValueError, match="entries"):
        fn(feats, labels, sig, sig_y[:-1], tau=tau)


def fpl_mse_ref(f, y, protos, classes):
    total = f.sum() * 0
    for i in range(f.shape[0]):
        for k in range(len(classes)):
            if int(classes[k]) == int(y[i]):
                total = total + ((f[i] - protos[k]) ** 2).mean()
    return total / f.shape[0]


@pytest.mark.parametrize("seed", [0, 1])
def test_fpl_mse_loss(seed):
    g = _gen(seed)
    f = torch.randn(10, 4, dtype=DT, generator=g)
    y = torch.randint(0, 4, (10,), generator=g)
    protos = torch.randn(3, 4, dtype=DT, generator=g)
    classes = torch.tensor([3, 0, 1])
    got, gg = grads(lambda a: L.fpl_mse_loss(a, y, protos, classes), f)
    exp, ge = grads(lambda a: fpl_mse_ref(a, y, protos, classes), f)
    assert_close(got, exp)
    assert_close(gg[0], ge[0])
    assert float(L.fpl_mse_loss(f, y, protos[:0], classes[:0])) == 0.0
    with pytest.raises(ValueError, match="distinct"):
        L.fpl_mse_loss(f, y, protos, torch.tensor([0, 0, 1]))


# ----------------------------------------------------------------------------------------------------
# 10. FedProx
# ----------------------------------------------------------------------------------------------------


def test_proximal_term():
    g = _gen(0)
    shapes = [(3, 4), (4,), (2, 2, 3), ()]
    p = [torch.randn(s, dtype=DT, generator=g).requires_grad_(True) for s in shapes]
    q = [torch.randn(s, dtype=DT, generator=g).requires_grad_(True) for s in shapes]
    expected = 0.0
    for a, b in zip(p, q):
        for u, v in zip(a.detach().flatten().tolist(), b.detach().flatten().tolist()):
            expected += (u - v) ** 2
    out = L.proximal_term(p, q, 1e-3)
    assert_close(out, 0.5e-3 * expected)
    out.backward()
    for a, b in zip(p, q):
        assert_close(a.grad, 1e-3 * (a - b).detach())
        assert b.grad is None
    assert float(L.proximal_term(iter(p), iter(p), 0.5).detach()) == 0.0
    with pytest.raises(ValueError, match="global_params has 3"):
        L.proximal_term(p, q[:3], 1.0)
    with pytest.raises(ValueError, match=r"params\[1\] has shape \(4,\)"):
        L.proximal_term(p, [q[0], q[0], q[2], q[3]], 1.0)
    with pytest.raises(ValueError, match="mu"):
        L.proximal_term(p, q, -1.0)
    with pytest.raises(ValueError, match="params is empty"):
        L.proximal_term([], [], 1.0)


IDENTICAL = [b for b in BATCHES if b[0].startswith("identical")]


@pytest.mark.parametrize("variant", ["reference", "paper"])
@pytest.mark.parametrize("name,feats,labels", IDENTICAL, ids=[b[0] for b in IDENTICAL])
def test_rcl_values_match_loop_reference_on_identical_features(variant, name, feats, labels):
    """All-identical features (every cosine 1, ties everywhere): the SCL and penalty values equal the loop
    reference's (gradients are left out: with ties the hardest pair is any of them)."""
    for tau, lam in [(0.05, 0.7), (0.5, 0.3)]:
        scl, pen = L.relaxed_contrastive_loss(feats, labels, tau=tau, lam=lam, variant=variant, return_parts=True)
        ref_scl, ref_pen = rcl_ref(feats, labels, tau, lam, variant)
        assert_close(scl, ref_scl)
        assert_close(pen, ref_pen)
        assert pen > 0  # a collapsed class is penalised


def _pcl_ref(f, y, sets, classes, tau, reduction):
    """FedPCL's prototype-anchored contrast with Python loops over sets, samples and batch members."""
    b = f.shape[0]
    cos = lambda u, v: float(torch.dot(u, v) / (u.norm() * v.norm()))  # noqa: E731
    per_set = []
    for s in range(sets.shape[0]):
        total = 0.0
        for i in range(b):
            hits = [k for k in range(classes.shape[0]) if int(classes[k]) == int(y[i])]
            if not hits:
                continue
            p = sets[s, hits[0]]
            same = [j for j in range(b) if int(y[j]) == int(y[i])]
            log_norm = math.log(sum(math.exp(cos(p, f[k]) / tau) for k in range(b)))
            total += -sum(cos(p, f[j]) / tau - log_norm for j in same) / len(same)
        per_set.append(total / b)
    return sum(per_set) if reduction == "sum" else sum(per_set) / len(per_set)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("reduction", ["sum", "mean"])
def test_prototype_anchor_contrast_matches_loop_reference(seed, reduction):
    from fedray.losses import prototype_anchor_contrast

    g = _gen(seed)
    f = torch.randn(11, 6, generator=g, dtype=DT)
    y = torch.randint(0, 5, (11,), generator=g)
    classes = torch.tensor([0, 1, 2, 4])  # class 3 has no prototype: its samples contribute 0
    sets = torch.randn(3, 4, 6, generator=g, dtype=DT)
    got = prototype_anchor_contrast(f, y, sets, classes, tau=0.07, reduction=reduction)
    assert float(got) == pytest.approx(_pcl_ref(f, y, sets, classes, 0.07, reduction), rel=1e-5)
