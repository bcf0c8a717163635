"""fedray.engine.client.grouped: multi-client execution equals sequential training, groups, unsupported settings."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedray.algorithms import build_algorithm
from fedray.algorithms.base import ClientContext
from fedray.config import ConfigError, TrainConfig, config_hash, from_dict
from fedray.data.loader import Augment
from fedray.data.table import DatasetMeta
from fedray.engine.client.grouped import GroupMember, check_multi_client, groups_of, train_group
from fedray.driver.runner import run_experiment
from fedray.core.weights import FlatParams
from fedray.models import model_for_meta
from tests.helpers import small_config

VEC = DatasetMeta(name="vec", num_classes=5, shape=(12,), dtype="float32", mean=(0.1,), std=(1.3,))
IMG = DatasetMeta(name="img", num_classes=10, shape=(1, 28, 28), dtype="uint8", mean=(0.13,), std=(0.31,))


def _run(cfg: dict, **kw):
    return run_experiment(from_dict(cfg), progress=False, log=lambda *a: None, **kw)


def _members(meta, sizes, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for pos, (cid, n) in enumerate(sizes):
        if meta.dtype == "uint8":
            x = rng.integers(0, 256, (n, *meta.shape)).astype(np.uint8)
        else:
            x = rng.standard_normal((n, *meta.shape)).astype(np.float32)
        out.append(GroupMember(cid=cid, pos=pos, images=x, labels=rng.integers(0, meta.num_classes, n)))
    return out


def _sequential(model_name, meta, opts, members, train, algo, gw, augment):
    model = model_for_meta(model_name, meta, **opts)
    flat = FlatParams(model)
    out = []
    for m in members:
        flat.load(gw)
        ctx = ClientContext(cid=m.cid, rnd=2, seed=0, model=model, flat=flat, global_weights=gw, images=m.images,
                            labels=m.labels, meta=meta, train=train, device=torch.device("cpu"), normalize=True,
                            augment=augment, prox_mu=algo.client_hints().prox_mu)  # as the worker sets it
        u = algo.local_update(ctx, {})
        out.append((u.weights, u.loss))
    return out


# ragged: 37 rows = 4 full batches + 5, a 1-row client, clients of 1..6 batches
RAGGED = [(5, 37), (9, 3), (2, 10), (7, 55), (11, 1)]
CASES = [
    ("mlp", VEC, {"hidden": [16]}, TrainConfig(batch_size=8, lr=0.1, local_epochs=2), "fedavg", {}, None),
    ("mlp", VEC, {"hidden": [16, 8]}, TrainConfig(batch_size=8, lr=0.1, momentum=0.9, weight_decay=1e-3, grad_clip=0.5),
     "fedprox", {"mu": 0.1}, None),
    ("mlp", VEC, {"hidden": []}, TrainConfig(batch_size=8, lr=0.01, optimizer="adam", weight_decay=1e-4,
                                             drop_last=True), "fedavg", {}, None),
    ("fedavg_cnn", IMG, {}, TrainConfig(batch_size=10, lr=0.05), "fedavg", {}, None),
    ("fedavg_cnn", IMG, {"hidden": 64}, TrainConfig(batch_size=10, lr=0.05, momentum=0.5), "fedprox", {"mu": 0.01},
     ["crop", "flip"]),
    # train.local_steps: 7 steps for every client, whatever its size (1-row clients take 7 one-row steps)
    ("mlp", VEC, {"hidden": [16]}, TrainConfig(batch_size=8, lr=0.05, local_steps=7, local_epochs=3), "fedprox",
     {"mu": 0.1}, None),
]


@pytest.mark.parametrize("model_name,meta,opts,train,algo_name,params,augment", CASES,
                         ids=["mlp-sgd-2epochs", "mlp-fedprox-momentum-clip", "logreg-adam-droplast", "cnn-sgd",
                              "cnn-fedprox-augment", "mlp-local-steps"])
def test_multi_client_matches_sequential_on_random_models(model_name, meta, opts, train, algo_name, params, augment):
    algo = build_algorithm(algo_name, params)
    torch.manual_seed(3)
    model = model_for_meta(model_name, meta, **opts)
    flat = FlatParams(model)
    gw = flat.read()
    sizes = RAGGED if model_name == "mlp" else [(5, 23), (9, 3), (2, 10), (4, 1)]
    members = _members(meta, sizes)
    aug = Augment.from_spec(augment) if augment else None
    ref = _sequential(model_name, meta, opts, members, train, algo, gw, aug)
    got = train_group(model, flat.layout, gw, members, rnd=2, seed=0, train=train, meta=meta, normalize=True,
                      augment=aug, prox_mu=algo.client_hints().prox_mu)
    assert np.array_equal(flat.read(), gw)  # the worker's own model is untouched
    moved = 0
    for (w_ref, loss_ref), r, m in zip(ref, got, members):
        assert r.num_samples == m.labels.shape[0]
        if train.local_steps is not None:
            assert r.steps == train.local_steps
        np.testing.assert_allclose(r.weights, w_ref, rtol=1e-5, atol=2e-6)
        if np.isnan(loss_ref):
            assert np.isnan(r.loss) and np.array_equal(r.weights, gw)  # no step (drop_last, 1 row)
        else:
            assert r.loss == pytest.approx(loss_ref, rel=1e-5, abs=1e-6)
            moved += 1
    assert moved >= 3


def test_groups_are_fixed_blocks_of_sampled_positions():
    chunk = [(4, 40), (5, 50), (6, 60), (7, 70), (8, 80)]
    assert groups_of(chunk, 2) == [[(4, 40), (5, 50)], [(6, 60), (7, 70)], [(8, 80)]]
    assert groups_of([(3, 1), (4, 2)], 4) == [[(3, 1)], [(4, 2)]]  # positions 3 and 4 lie in blocks 0 and 1


def test_multi_client_run_matches_sequential_run_on_real_data(tmp_path, partition_cache):
    base = dict(train__rounds=2, train__clients_per_round=6, eval__every=2)
    seq = _run(small_config(tmp_path / "seq", partition_cache, **base))
    grouped = _run(small_config(tmp_path / "mc", partition_cache, **base, engine__multi_client=3))
    w_seq = np.load(seq.run_dir / "final_weights.npy")
    w_mc = np.load(grouped.run_dir / "final_weights.npy")
    np.testing.assert_allclose(w_mc, w_seq, rtol=1e-4, atol=3e-5)  # float rounding only (weights ~0.1)
    assert grouped.accuracy == pytest.approx(seq.accuracy, abs=2e-3)
    assert [r["num_samples"] for r in grouped.rounds] == [r["num_samples"] for r in seq.rounds]
    assert grouped.rounds[0]["loss"] == pytest.approx(seq.rounds[0]["loss"], rel=1e-5)


def test_unsupported_settings_fail_naming_the_field(tmp_path, partition_cache):
    with pytest.raises(ConfigError, match=r"^engine\.multi_client"):
        from_dict(small_config(tmp_path, partition_cache, engine__multi_client=0))
    for over, what in [({"algorithm__name": "moon"}, "supports_multi_client"),
                       ({"algorithm__name": "fedlc"}, "supports_multi_client"),  # a FedAvg subclass: not inherited
                       ({"model__name": "resnet10_gn", "model__params": {"norm": "bn", "width": 8}}, "BatchNorm"),
                       ({"model__name": "alexnet_split"}, "dropout")]:
        cfg = small_config(tmp_path, partition_cache, engine__multi_client=2, **over)
        with pytest.raises(ConfigError, match=r"^engine\.multi_client.*" + what):
            _run(cfg)
    check_multi_client(from_dict(small_config(tmp_path, partition_cache, engine__multi_client=2)), IMG)
    one = from_dict(small_config(tmp_path, partition_cache))
    assert config_hash(one) == config_hash(from_dict(small_config(tmp_path, partition_cache, engine__multi_client=1)))
    assert config_hash(one) != config_hash(from_dict(small_config(tmp_path, partition_cache, engine__multi_client=2)))
