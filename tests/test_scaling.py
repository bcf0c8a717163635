"""Multi-client execution (equal to sequential training, identical across worker counts), the scaling
sweep's table, and the coordinator's memory as clients per round grow."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from fedray.algorithms import build_algorithm
from fedray.algorithms.base import ClientContext
from fedray.config import ConfigError, TrainConfig, config_hash, from_dict
from fedray.data.loader import Augment
from fedray.data.table import DatasetMeta
from fedray.engine.client.grouped import GroupMember, check_multi_client, groups_of, train_group
from fedray.engine.runner import run_experiment
from fedray.core.weights import FlatParams
from fedray.models import model_for_meta
from tests.conftest import small_config

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
]


@pytest.mark.parametrize("model_name,meta,opts,train,algo_name,params,augment", CASES,
                         ids=["mlp-sgd-2epochs", "mlp-fedprox-momentum-clip", "logreg-adam-droplast", "cnn-sgd",
                              "cnn-fedprox-augment"])
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


@pytest.mark.ray
def test_multi_client_identical_across_worker_counts(tmp_path, partition_cache, ray_session):
    base = dict(train__rounds=2, train__clients_per_round=9, engine__multi_client=2, model__name="mlp",
                model__params={"hidden": [32]})
    hashes = {"local-1w": _run(small_config(tmp_path / "l", partition_cache, **base)).weights_hash}
    cfg = small_config(tmp_path / "r2", partition_cache, engine__backend="ray", engine__num_workers=2, **base)
    hashes["ray-2w"] = _run(cfg).weights_hash
    # 4 workers, and a task size that is not a multiple of the group size (rounded up: same groups)
    cfg = small_config(tmp_path / "r4", partition_cache, engine__backend="ray", engine__num_workers=4,
                       engine__chunk_size=3, **base)
    hashes["ray-4w-chunk3"] = _run(cfg).weights_hash
    assert len(set(hashes.values())) == 1, hashes


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


# ------------------------------------------------------------------------------------ scaling table
def _synthetic_experiment(tmp_path, partition_cache, **over) -> dict:
    cfg = small_config(tmp_path, partition_cache,
                       data__source="synthetic", data__normalize=False,
                       data__params={"num_clients": 60, "samples_per_client_mean": 12, "min_samples": 3,
                                     "size_sigma": 0.5},
                       data__partition={"name": "natural", "num_clients": 60, "params": {}},
                       model__name="mlp", model__params={"hidden": [16]}, train__clients_per_round=5)
    for key, value in over.items():
        node = cfg
        parts = key.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return cfg


def test_scaling_table_has_the_documented_columns(tmp_path, partition_cache):
    from fedray.apps.scale import COLUMNS, load_scale, run_scale

    spec = load_scale(data={
        "name": "tiny", "rounds": 2, "output": str(tmp_path / "out"),
        "experiment": _synthetic_experiment(tmp_path, partition_cache),
        "defaults": {"population": 40, "clients_per_round": 5, "num_workers": 1},
        "sweeps": [{"clients_per_round": [5, 20], "multi_client": [1, 4]}, {"population": [10, 60]},
                   {"clients_per_round": [50], "population": [40]}],  # more clients per round than clients: skipped
    })
    rows, files = run_scale(spec, log=lambda *a: None)
    table = pq.read_table(tmp_path / "out" / "scaling.parquet")
    assert table.column_names == list(COLUMNS)
    assert table.num_rows == len(spec.points) == 7
    by = {(r["population"], r["clients_per_round"], r["multi_client"]): r for r in table.to_pylist()}
    assert by[(40, 50, 1)]["status"].startswith("skipped")
    ok = [r for r in table.to_pylist() if r["status"] == "ok"]
    assert len(ok) == 6
    for r in ok:
        assert r["client_updates"] == r["clients_per_round"]  # round 2 only (round 1 is the warm-up)
        assert r["client_updates_per_s"] > 0 and r["samples_per_s"] > 0 and r["round_s"] > 0
        assert r["coordinator_peak_mb"] > 0 and r["num_params"] == 60 * 16 + 16 + 16 * 10 + 10
        assert r["backend"] == "local" and r["source"] == "synthetic"
    # multi-client changes float rounding only
    assert by[(40, 20, 4)]["accuracy"] == pytest.approx(by[(40, 20, 1)]["accuracy"], abs=0.02)
    names = {f.name for f in files}
    assert {"scaling.parquet", "scaling.csv", "scaling.md", "throughput_vs_clients_per_round.png",
            "memory_vs_population.png", "latency_vs_population.png"} <= names


def test_scale_resume_keeps_finished_points(tmp_path, partition_cache):
    """A sweep stopped after its first point (the table is rewritten after every point) resumes with
    ``resume=True``: the finished point is kept as measured, only the rest runs; a changed experiment is refused."""
    import pyarrow.parquet as pq

    from fedray.apps.scale import load_scale, run_scale

    data = {"name": "tiny", "rounds": 2, "output": str(tmp_path / "out"),
            "experiment": _synthetic_experiment(tmp_path, partition_cache),
            "defaults": {"population": 40, "num_workers": 1}, "sweep": {"clients_per_round": [5, 10, 20]}}
    rows, _ = run_scale(load_scale(data=data), log=lambda *a: None)
    table = tmp_path / "out" / "scaling.parquet"
    pq.write_table(pq.read_table(table).slice(0, 1), str(table))  # as if stopped during point 2
    logs: list[str] = []
    again, _ = run_scale(load_scale(data=data), log=logs.append, resume=True)
    assert [r["status"] for r in again] == ["ok"] * 3
    assert "kept" in logs[0] and not any("kept" in m for m in logs[1:])
    assert again[0]["total_s"] == rows[0]["total_s"]  # the same measurement, not a new one
    assert [r["weights_hash"] for r in again] == [r["weights_hash"] for r in rows]
    changed = {**data, "experiment": {**data["experiment"], "seed": 1}}
    with pytest.raises(ConfigError, match=r"--resume: experiment differs"):
        run_scale(load_scale(data=changed), log=lambda *a: None, resume=True)


def test_scale_file_errors_name_the_field(tmp_path, partition_cache):
    from fedray.apps.scale import load_scale

    exp = _synthetic_experiment(tmp_path, partition_cache)
    for bad, field in [({"sweep": {"clients": [1]}}, r"^sweep\.clients"),
                       ({"sweeps": [{"population": [0]}]}, r"^sweeps\[0\]\.population"),
                       ({"rounds": 0}, r"^rounds"), ({"defaults": {"num_workers": [1, 2]}}, r"^defaults\.num_workers"),
                       ({"colour": 1}, r"^colour"), ({"experiment": None, "base": "missing.yaml"}, r"^base")]:
        with pytest.raises(ConfigError, match=field):
            load_scale(data={"experiment": exp, **bad})


# ------------------------------------------------------------------------------------ memory
@pytest.mark.ray
def test_coordinator_memory_flat_in_clients_per_round(tmp_path, partition_cache, ray_session):
    """Coordinator memory at 10 and 200 clients per round. The updates (1.2 MB each) stay in the object
    store and are folded one by one in sampled order, so the coordinator's private memory does not grow
    with the clients per round; keeping all 200 updates would take 240 MB."""
    peak = {}
    for k in (10, 200):
        cfg = _synthetic_experiment(tmp_path / f"k{k}", partition_cache, train__rounds=2, train__clients_per_round=k,
                                    data__params={"num_clients": 400, "samples_per_client_mean": 12,
                                                  "min_samples": 3, "size_sigma": 0.5},
                                    data__partition={"name": "natural", "num_clients": 400, "params": {}},
                                    model__params={"hidden": [512, 512]}, eval__every=2,
                                    engine__backend="ray", engine__num_workers=2)
        res = _run(cfg)
        assert sum(r["num_clients"] for r in res.rounds) == 2 * k
        mem = [r["memory"] for r in res.rounds]
        peak[k] = (max(m["coordinator_anon_mb"] for m in mem), mem[-1]["coordinator_peak_mb"])
        assert all(m["workers_peak_mb"] > 0 for m in mem)
    update_mb = (60 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10) * 4 / 2**20
    assert update_mb > 1.1
    # private (anonymous) memory: the coordinator's own heap, where Flower-style gathering would hold them
    grown_anon = peak[200][0] - peak[10][0]
    assert grown_anon < 24 * update_mb, peak  # well below the 190 x 1.2 MB of holding every extra update
