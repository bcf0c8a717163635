"""FedCCL and its family (FedCCL ablations, FedCCL+, FedAvg+, FedProto, FPL, FedPCL).

The losses themselves are tested in tests/losses/, FINCH in tests/clustering/ and the robustness metrics in
tests/metrics/test_robustness.py; here: end-to-end runs on the local backend, determinism (and Ray == local
once), first-round behaviour, missing classes, order independence of the coordinator's signals, signal byte
accounting and config errors."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from fedray.algorithms import ClientContext, build_algorithm
from fedray.config import ConfigError, TrainConfig
from fedray.engine.round_report import ByteCounts, ClientTally, arrays_nbytes
from tests.helpers import cnn4_config as _cfg, run_quiet as _run

pytestmark = pytest.mark.usefixtures("_cached_sources")  # tests/conftest.py


# ------------------------------------------------------------------------------------------- end to end
@pytest.mark.parametrize(
    "alg,params",
    [
        ("fedccl", {}),
        ("fedccl", {"signals": "local", "local_mode": "averaged"}),
        ("fedccl", {"signals": "global", "global_mode": "averaged"}),
        ("fedccl_plus", {"adv_steps": 2, "adv_eps": 0.1}),
        ("fedavg_plus", {"adv": "fgsm", "adv_eps": 0.1}),
        ("fedproto", {}),
        ("fpl", {}),
        ("fedproc", {}),  # its prototypes were not counted while each algorithm counted its own bytes
        ("fedpcl", {}),
        ("fedpcl", "frozen"),  # FedPCL's own setting: frozen backbone, contrast on the MLP head's hidden layer
    ],
)
def test_end_to_end_two_rounds(tmp_path, partition_cache, alg, params):
    over = {}
    if params == "frozen":
        params = {}
        over["model"] = {"name": "cnn_backbone_mlp", "params": {
            "backbone": "cnn4", "backbone_options": {"channels": [4, 8], "embed_dim": 16}, "hidden": 16,
            "freeze_backbone": True}}
    res = _run(_cfg(tmp_path, partition_cache, alg, params, **over))
    assert [r["round"] for r in res.rounds] == [1, 2]
    for r in res.rounds:
        assert np.isfinite(r["loss"]) and 0.0 <= r["accuracy"] <= 1.0
        assert r["num_clients"] == 3
    if alg != "fedavg_plus":  # every signal/prototype method reports its communication
        r1, r2 = res.rounds
        assert r1["bytes"]["signals_broadcast"] == 0 and r1["bytes"]["signals_upload"] > 0
        assert r2["bytes"]["signals_broadcast"] > 0
        assert r2["bytes_signals"] == r2["bytes"]["signals_broadcast"] + r2["bytes"]["signals_upload"]


def test_fedccl_inter_domain_digits(tmp_path, partition_cache):
    """One client per domain (FedCCL's inter-domain setting) with a backbone + MLP head: per-domain accuracy."""
    cfg = _cfg(tmp_path, partition_cache, "fedccl", {},
               data__source="digits-domains", data__params={"max_per_domain": 100},
               data__partition={"name": "domain", "num_clients": 5,
                                "params": {"clients_per_domain": 1, "balance": "imbalanced", "alpha": 0.5}},
               model={"name": "cnn_backbone_mlp", "params": {
                   "backbone": "cnn5", "backbone_options": {"channels": [4, 8], "hidden": 16, "embed_dim": 16},
                   "hidden": 16}},
               train={"rounds": 2, "clients_per_round": 5, "batch_size": 32, "optimizer": "adam", "lr": 0.001})
    res = _run(cfg)
    last = res.rounds[-1]
    assert set(last["domain_accuracy"]) == {"mnist", "mnistm", "svhn-like", "digits", "inverted"}
    assert last["num_signals"] > 0 and last["bytes"]["signals_broadcast"] > 0


@pytest.mark.ray
@pytest.mark.parametrize("alg", ["fedccl", "fedproto", "fpl", "fedpcl", "fedccl_plus", "fedavg_plus"])
def test_deterministic_and_ray_matches_local(tmp_path, partition_cache, ray_session, alg):
    params = {"adv_steps": 2, "adv_eps": 0.1} if alg.endswith("_plus") else {}
    cfg = _cfg(tmp_path, partition_cache, alg, params, train={"rounds": 2, "clients_per_round": 4, "batch_size": 64,
                                                              "lr": 0.05})
    a = _run(cfg)
    b = _run({**cfg, "output": {**cfg["output"], "root": str(tmp_path / "runs2")}})
    assert a.weights_hash == b.weights_hash
    ray_cfg = {**cfg, "engine": {"backend": "ray", "num_workers": 2},
               "output": {**cfg["output"], "root": str(tmp_path / "runs_ray")}}
    c = _run(ray_cfg)
    assert c.weights_hash == a.weights_hash
    assert [r.get("bytes_signals") for r in c.rounds] == [r.get("bytes_signals") for r in a.rounds]


# ------------------------------------------------------------------------------------ client-side units
def _toy_ctx(labels, rnd=2, cid=0, seed=0, frozen=False):
    from fedray.data.table import DatasetMeta
    from fedray.core.weights import FlatParams
    from fedray.models import build_model

    rng = np.random.default_rng(seed)
    labels = np.asarray(labels, dtype=np.int64)
    images = rng.integers(0, 256, size=(labels.size, 1, 28, 28), dtype=np.uint8)
    images[np.arange(labels.size), 0, labels, :] = 255  # a class-dependent stripe: learnable
    meta = DatasetMeta("toy", 10, (1, 28, 28), mean=(0.5,), std=(0.3,))
    torch.manual_seed(0)
    if frozen:  # FedCCL's inter-domain model with a frozen (pre-trained) backbone: only the MLP head trains
        model = build_model("cnn_backbone_mlp", in_channels=1, image_size=28, num_classes=10, backbone="cnn4",
                            backbone_options={"channels": [4, 8], "embed_dim": 16}, hidden=12, freeze_backbone=True)
    else:
        model = build_model("cnn4", in_channels=1, image_size=28, num_classes=10, channels=(4, 8), embed_dim=16)
    flat = FlatParams(model)
    return ClientContext(cid=cid, rnd=rnd, seed=0, model=model, flat=flat, global_weights=flat.read(), images=images,
                         labels=labels, meta=meta, train=TrainConfig(batch_size=16, lr=0.05), device=torch.device("cpu"),
                         normalize=True, num_classes=10)


def _fake_extras(cids, dim=16, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for cid in cids:
        classes = np.sort(rng.choice(10, size=4, replace=False))
        labs = np.repeat(classes, rng.integers(1, 4, size=classes.size))
        out.append({"cid": cid, "num_samples": 50, "signals": rng.normal(size=(labs.size, dim)).astype(np.float32),
                    "signal_labels": labs.astype(np.int64)})
    return out


@pytest.mark.parametrize("alg", ["fedccl", "fedccl_plus", "fedproto", "fpl", "fedpcl"])
def test_first_round_is_plain_cross_entropy(alg):
    """With no signal/prototype yet the update equals FedAvg's (FedCCL+ equals FedAvg+; FedPCL in its one-view
    form: the two-view default trains CE on two augmented views)."""
    labels = np.arange(48) % 5
    ref_name = "fedavg_plus" if alg == "fedccl_plus" else "fedavg"
    ref = build_algorithm(ref_name, {}).local_update(_toy_ctx(labels, rnd=1), {})
    algo = build_algorithm(alg, {"views": 1} if alg == "fedpcl" else {})
    upd = algo.local_update(_toy_ctx(labels, rnd=1), algo.broadcast(1, None, algo.init_state(None)))
    assert np.array_equal(upd.weights, ref.weights) and upd.loss == ref.loss


@pytest.mark.parametrize("alg", ["fedccl", "fedproto", "fpl"])
def test_frozen_backbone_signals_come_from_the_trainable_head(alg):
    """With a frozen backbone the contrast / prototype terms act on the head's hidden layer (12-d here), so they
    change the update; on the frozen 16-d embedding they would have no gradient and equal plain CE."""
    labels = np.arange(48) % 3
    algo = build_algorithm(alg, {})
    key = "signals" if alg == "fedccl" else "protos"
    state = algo.init_state(None)
    first = algo.local_update(_toy_ctx(labels, rnd=1, frozen=True), algo.broadcast(1, None, state))
    assert first.extras[key].shape[1] == 12
    _, state = algo.after_aggregate(1, None, [{"cid": 0, "num_samples": 48, **first.extras}], state)
    upd = algo.local_update(_toy_ctx(labels, frozen=True), algo.broadcast(2, None, state))
    ref = build_algorithm("fedavg", {}).local_update(_toy_ctx(labels, frozen=True), {})
    assert np.isfinite(upd.loss) and not np.array_equal(upd.weights, ref.weights)
    explicit = build_algorithm(alg, {"tap": "embedding"})  # the old behaviour, on request: CE only
    emb = explicit.local_update(_toy_ctx(labels, frozen=True), explicit.broadcast(1, None, explicit.init_state(None)))
    assert emb.extras[key].shape[1] == 16


def test_fedccl_client_with_missing_classes():
    """A client holding classes {0, 1, 2} trains against signals of all ten classes and uploads only its own."""
    algo = build_algorithm("fedccl", {})
    state = algo.init_state(None)
    _, state = algo.after_aggregate(1, None, _fake_extras([3, 4, 5]), state)
    payload = algo.broadcast(2, None, state)
    assert set(payload) == {"local_signals", "local_labels", "global_signals", "global_classes"}
    ctx = _toy_ctx(np.arange(40) % 3)
    upd = algo.local_update(ctx, payload)
    fedavg = build_algorithm("fedavg", {}).local_update(_toy_ctx(np.arange(40) % 3), {})
    assert np.isfinite(upd.loss) and not np.array_equal(upd.weights, fedavg.weights)  # the contrast acts
    assert set(upd.extras["signal_labels"].tolist()) == {0, 1, 2}
    assert upd.extras["signals"].shape == (upd.extras["signal_labels"].size, 16)


def test_global_signals_independent_of_client_order_and_partial_participation():
    algo = build_algorithm("fedccl", {})
    extras = _fake_extras([7, 2, 9, 0, 5])
    _, a = algo.after_aggregate(1, None, extras, algo.init_state(None))
    _, b = algo.after_aggregate(1, None, [extras[i] for i in (3, 1, 4, 0, 2)], algo.init_state(None))
    for key in ("local", "global"):
        for arr in a[key]:
            assert np.array_equal(a[key][arr], b[key][arr])
    assert a["global"]["classes"].tolist() == sorted(set(np.concatenate([e["signal_labels"] for e in extras]).tolist()))
    # partial participation: client 2 sends new signals, the others' latest ones are kept
    new2 = _fake_extras([2], seed=1)
    _, c = algo.after_aggregate(2, None, new2, a)
    assert sorted(c["clients"]) == [0, 2, 5, 7, 9]
    assert np.array_equal(c["clients"][2]["signals"], new2[0]["signals"])
    assert np.array_equal(c["clients"][9]["signals"], a["clients"][9]["signals"])
    # byte accounting (the engine measures the arrays it moves): round 2 broadcast the round-1 collection,
    # round 2's upload was client 2's signals
    tally = ClientTally()
    tally.add(SimpleNamespace(cid=2, num_samples=1, loss=0.0, extras={k: new2[0][k] for k in ("signals", "signal_labels")}))
    sent = ByteCounts(signals_broadcast=3 * arrays_nbytes(algo.broadcast(2, None, a)), signals_upload=tally.upload_signals)
    assert sent.signals_upload == new2[0]["signals"].nbytes + new2[0]["signal_labels"].nbytes
    assert sent.signals_broadcast == 3 * (a["local"]["signals"].nbytes + a["local"]["labels"].nbytes
                                          + a["global"]["signals"].nbytes + a["global"]["classes"].nbytes) > 0


def test_global_signal_modes():
    from fedray.algorithms.fedccl import global_signals

    rng = np.random.default_rng(0)
    sig = rng.normal(size=(30, 8)).astype(np.float32)
    lab = np.repeat(np.arange(3), 10)
    avg, cls = global_signals(sig, lab, "averaged")
    assert cls.tolist() == [0, 1, 2] and np.allclose(avg[1], sig[10:20].mean(0), atol=1e-6)
    clu, cls2 = global_signals(sig, lab, "clustered")
    assert clu.shape == (3, 8) and cls2.tolist() == [0, 1, 2]
    # two tight, far apart groups of unequal size: the clustered signal is the unweighted mean of FINCH's
    # cluster means (Eq. 15), the averaged one the size-weighted mean of the rows (Eq. 12)
    from fedray.clustering import finch_means

    g = np.concatenate([np.tile([1.0, 0, 0], (6, 1)), np.tile([0, 1.0, 0], (2, 1))]).astype(np.float32)
    g += rng.normal(scale=1e-3, size=g.shape).astype(np.float32)
    clu, _ = global_signals(g, np.zeros(8, np.int64), "clustered")
    means, _ = finch_means(g, "last")
    assert means.shape[0] > 1 and np.allclose(clu[0], means.mean(0), atol=1e-6)
    avg, _ = global_signals(g, np.zeros(8, np.int64), "averaged")
    assert np.allclose(avg[0], [0.75, 0.25, 0], atol=1e-2) and clu[0][1] > avg[0][1] + 0.05


# ------------------------------------------------------------------------------------------ config errors
@pytest.mark.parametrize(
    "alg,params,field",
    [
        ("fedccl", {"signals": "neither"}, "signals"),
        ("fedccl", {"local_mode": "kmeans"}, "local_mode"),
        ("fedccl", {"global_mode": 3}, "global_mode"),
        ("fedccl", {"tau": 0}, "tau"),
        ("fedccl", {"w_local": -1}, "w_local"),
        ("fedccl", {"adv_eps": 0.1}, "adv_eps"),  # adversarial params belong to fedccl_plus only
        ("fedccl_plus", {"adv": "cw"}, "adv"),
        ("fedccl_plus", {"adv_steps": 0}, "adv_steps"),
        ("fedavg_plus", {"adv_eps": -0.1}, "adv_eps"),
        ("fedavg_plus", {"adv_random_start": "yes"}, "adv_random_start"),
        ("fedproto", {"mu": -1}, "mu"),
        ("fpl", {"tau": -0.02}, "tau"),
        ("fedpcl", {"set_reduction": "max"}, "set_reduction"),
        ("fedpcl", {"ce_weight": "1"}, "ce_weight"),
    ],
)
def test_config_errors_name_the_parameter(alg, params, field):
    with pytest.raises(ConfigError, match=rf"algorithm\.params\.{field}\b"):
        build_algorithm(alg, params)


def test_fedpcl_tap_must_exist():
    algo = build_algorithm("fedpcl", {"tap": "nope"})
    with pytest.raises(ConfigError, match=r"algorithm\.params\.tap"):
        algo.local_update(_toy_ctx(np.arange(16) % 2), {})


def test_fedpcl_two_view_contrast_matches_the_released_code_equation():
    """views: 2 (the released ConLoss): 2B rows (view 1 then view 2), row r's anchor = raw prototype of its class
    in set s, logits = anchor . f_k / tau over all 2B rows with the row's own entry masked, positives = the other
    rows of its class; mean over rows, summed over the sets. Naive loops in float64."""
    import math

    from fedray.losses import prototype_two_view_contrast

    g = torch.Generator().manual_seed(0)
    labels = torch.tensor([0, 2, 2, 1, 0])
    feats = torch.nn.functional.normalize(torch.randn(10, 6, generator=g), dim=1)
    sets = torch.randn(3, 3, 6, generator=g) * 0.4  # raw (not unit) prototypes
    classes = torch.tensor([0, 1, 2])
    got = float(prototype_two_view_contrast(feats, labels, sets, classes, tau=0.07))
    y = labels.tolist() * 2
    f = feats.double().numpy()
    ref = 0.0
    for s in range(3):
        total = 0.0
        for r in range(10):
            a = sets[s, y[r]].double().numpy()
            logit = [float(a @ f[k]) / 0.07 for k in range(10)]
            den = math.log(sum(math.exp(logit[k]) for k in range(10) if k != r))
            pos = [k for k in range(10) if k != r and y[k] == y[r]]
            total += -sum(logit[k] - den for k in pos) / len(pos)
        ref += total / 10
    assert got == pytest.approx(ref, rel=1e-5)
    mean = float(prototype_two_view_contrast(feats, labels, sets, classes, tau=0.07, reduction="mean"))
    assert mean == pytest.approx(ref / 3, rel=1e-5)


def test_fedpcl_two_views_train_differently_from_one_view_and_send_normalised_prototypes():
    labels = np.arange(48) % 3
    algo = build_algorithm("fedpcl", {})
    state = algo.init_state(None)
    first = algo.local_update(_toy_ctx(labels, rnd=1, frozen=True), algo.broadcast(1, None, state))
    np.testing.assert_array_less(np.linalg.norm(first.extras["protos"], axis=1), 1.0 + 1e-6)  # means of unit vectors
    _, state = algo.after_aggregate(1, None, [{"cid": 0, "num_samples": 48, **first.extras}], state)
    two = algo.local_update(_toy_ctx(labels, frozen=True), algo.broadcast(2, None, state))
    one_algo = build_algorithm("fedpcl", {"views": 1})
    one = one_algo.local_update(_toy_ctx(labels, frozen=True), algo.broadcast(2, None, state))
    assert np.isfinite(two.loss) and not np.array_equal(two.weights, one.weights)
    with pytest.raises(ConfigError, match="algorithm.params.view_augment"):
        build_algorithm("fedpcl", {"view_augment": []})
