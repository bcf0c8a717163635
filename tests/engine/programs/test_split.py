"""The split round program (fedray.engine.programs.split) end to end: every split method, exact gradients,
client order, replay after errors, resume, config errors, Ray == local and a worker lost mid-iteration."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from fedray.config import ConfigError, from_dict
from fedray.engine.split_layout import SplitLayout, batch_plan, batch_sizes
from fedray.losses import label_prior, logit_adjusted_ce
from fedray.models import build_model
from fedray.reporting.rundir import RunDir
from tests.helpers import SPLIT_METHODS, TINY_ALEXNET, run_quiet as _run, split_config as _cfg


def _tiny_model(seed=0, **opts):
    torch.manual_seed(seed)
    return build_model("alexnet_split", in_channels=1, image_size=28, num_classes=10, **{**TINY_ALEXNET, **opts})


# ------------------------------------------------------------------------------------ exactness
@pytest.mark.parametrize("name", ["scala", "splitfed_v1", "splitfed_v2"])
def test_single_client_gradient_equals_unsplit_backprop(tmp_path, partition_cache, name):
    """One client, one local iteration, SGD lr 1: the update of both halves is minus the gradient of the
    unsplit model's loss on the same minibatch (SCALA with prior: batch, i.e. P_k = P_s)."""
    from fedray.data.store import PartitionStore
    from fedray.core.weights import flatten

    params = {"batch_size": 16, "local_iters": 1, **({"prior": "batch"} if name == "scala" else {})}
    cfg = _cfg(tmp_path, partition_cache, name, params, model_params={"dropout": 0.0}, train__rounds=1,
               train__clients_per_round=1, train__lr=1.0, eval__every=1)
    res = _run(cfg)
    w1 = np.load(res.run_dir / "final_weights.npy")

    store = PartitionStore.open(json.loads((res.run_dir / "run.json").read_text())["partition_path"])
    cid = int(np.random.default_rng([0, 1]).choice(100, size=1, replace=False)[0])
    images, labels = store.client_arrays(cid)
    bk = int(batch_sizes([len(labels)], 16)[0])
    idx = batch_plan(np.random.default_rng([0, 1, cid]), len(labels), bk, 1)[0]
    x = torch.from_numpy(np.array(images[idx])).float() / 255.0
    y = torch.from_numpy(np.array(labels[idx], dtype=np.int64))

    model = _tiny_model(dropout=0.0)
    w0 = flatten(model)
    model.train()
    z = model(x)
    loss = logit_adjusted_ce(z, y, label_prior(y, 10)) if name == "scala" else F.cross_entropy(z, y)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    g = np.concatenate([t.reshape(-1).numpy() for t in grads])  # no buffers: parameter order = flat order
    lay = SplitLayout(model, "block2")
    scale = np.abs(g).max()
    for part in (lay.client_train, lay.server_train):  # client-side gradient and server-side step
        np.testing.assert_allclose(w0[part] - w1[part], g[part], rtol=0, atol=1e-5 * scale)
    assert np.abs(g[lay.client_train]).max() > 0


# ------------------------------------------------------------------------------------ end to end
@pytest.mark.parametrize("name", SPLIT_METHODS)
def test_every_split_method_runs_two_rounds_and_is_worker_count_invariant(tmp_path, partition_cache, name):
    one = _run(_cfg(tmp_path / "w1", partition_cache, name))
    three = _run(_cfg(tmp_path / "w3", partition_cache, name, engine__num_workers=3))
    assert one.weights_hash == three.weights_hash
    rows = RunDir(one.run_dir).read_metrics()
    assert [r["round"] for r in rows] == [1, 2]
    r = rows[-1]
    assert math.isfinite(r["loss"]) and 0.0 <= r["accuracy"] <= 1.0
    sizes = RunDir(one.run_dir).read_ledger().to_pylist()
    per_client = [row for row in sizes if row["round"] == 2 and row["failure"] is None]
    assert len(per_client) == 4 and sum(row["samples"] for row in per_client) == 2 * r["split"]["batch"]
    b = r["bytes"]
    act = 2 * r["split"]["batch"] * 8 * 7 * 7 * 4  # iterations x sum B_k x activation size x float32
    assert b["activations"] == act
    assert b["gradients"] == (0 if name == "sfl_local_loss" else act)
    assert b["total"] == b["broadcast"] + b["upload"] + b["activations"] + b["labels"] + b["gradients"]
    if name == "scala":
        assert math.isfinite(r["client_loss"])


def test_splitfed_v2_client_order_is_the_interleaved_arithmetic_chained_client_by_client(tmp_path, partition_cache):
    """order: client (the reference: each client's whole local training meets the server before the next)
    takes the same server steps as order: iteration when a round has one client or one local iteration
    (the same sequence of steps), and a different sequence otherwise."""
    def run(sub, order, **over):
        cfg = _cfg(tmp_path / sub, partition_cache, "splitfed_v2", {"order": order, **over.pop("params", {})},
                   model_params={"dropout": 0.0}, **over)
        return _run(cfg)

    one_client = {"train__clients_per_round": 1}
    assert run("c1", "client", **one_client).weights_hash == run("i1", "iteration", **one_client).weights_hash
    one_iter = {"params": {"local_iters": 1}}
    assert run("c2", "client", **one_iter).weights_hash == run("i2", "iteration", **one_iter).weights_hash
    assert run("c3", "client").weights_hash != run("i3", "iteration").weights_hash


def test_splitfed_v3_keeps_client_models_local(tmp_path, partition_cache):
    few = {"name": "classes_per_client", "num_clients": 6, "params": {"classes": 2}}
    v1 = _run(_cfg(tmp_path / "v1", partition_cache, "splitfed_v1", data__partition=few, train__rounds=3))
    v3 = _run(_cfg(tmp_path / "v3", partition_cache, "splitfed_v3", data__partition=few, train__rounds=3))
    assert v1.weights_hash != v3.weights_hash  # returning clients resume from their own client models
    saved = list((Path(RunDir(v3.run_dir).state_path)).rglob("r*.npz"))
    assert saved


def test_client_error_mid_iteration_is_replayed_with_identical_result(tmp_path, partition_cache):
    clean = _run(_cfg(tmp_path / "clean", partition_cache, "scala", engine__num_workers=2))
    sampled = [int(c) for c in np.random.default_rng([0, 2]).choice(100, size=4, replace=False)]
    fault = {"kind": "raise", "round": 2, "client": sampled[1], "iteration": 2, "times": 1}
    faulty = _run(_cfg(tmp_path / "faulty", partition_cache, "scala", engine__num_workers=2,
                       engine__fault_injection=fault))
    assert faulty.weights_hash == clean.weights_hash
    assert faulty.rounds[1]["retries"] == 1
    fails = [r for r in RunDir(faulty.run_dir).read_ledger().to_pylist() if r["failure"]]
    assert len(fails) == 1 and "injected fault" in fails[0]["failure"] and fails[0]["client"] == sampled[1]
    # a client failing more often than engine.max_client_retries fails the round with a clear error
    fault = {**fault, "times": 5}
    with pytest.raises(RuntimeError, match=f"client {sampled[1]} failed 2 times"):
        _run(_cfg(tmp_path / "bad", partition_cache, "scala", engine__max_client_retries=1,
                  engine__fault_injection=fault))


def test_checkpointed_state_resumes_scala_exactly(tmp_path, partition_cache):
    """Server model + server momentum live in the coordinator state: a fresh coordinator loaded from it
    continues bit-identically."""
    from fedray.engine.coordinator import Coordinator
    from fedray.driver.handle import test_payload
    from fedray.driver.setup import prepare_data
    from fedray.engine.spec import CoordinatorSpec

    cfg = from_dict(_cfg(tmp_path, partition_cache, "scala", train__momentum=0.9, train__rounds=3))
    bundle, store = prepare_data(cfg)
    d = cfg.to_dict()
    d.pop("source_path", None)

    def coord(sub):
        (tmp_path / sub).mkdir()
        return Coordinator(CoordinatorSpec(d, str(store.path), str(tmp_path / sub), test_payload(bundle), 1, 1.0, 0.0,
                                           str(tmp_path / sub / "state")))

    a = coord("a")
    for r in (1, 2, 3):
        a.run_round(r)
    b = coord("b")
    b.run_round(1)
    st = b.state_dict()
    assert "momentum_buffer" in st["algorithm_state"]["server_optimizer"]
    c = coord("c")
    c.load_state_dict(st)
    for r in (2, 3):
        c.run_round(r)
    assert c.weights_hash() == a.weights_hash()


def test_split_config_errors_name_the_field(tmp_path, partition_cache):
    with pytest.raises(ConfigError, match=r"^server\.name"):
        _run(_cfg(tmp_path, partition_cache, "scala", server={"name": "fedavgm"}))
    with pytest.raises(ConfigError, match=r"^algorithm\.params\.prior"):
        _run(_cfg(tmp_path, partition_cache, "scala", {"prior": "global"}))
    with pytest.raises(ConfigError, match=r"^algorithm\.params\.local_iters"):
        _run(_cfg(tmp_path, partition_cache, "splitfed_v1", {"local_iters": 0}))
    with pytest.raises(ConfigError, match=r"^algorithm\.params\.split_point"):
        _run(_cfg(tmp_path, partition_cache, "splitfed_v2", {"split_point": "nowhere"}))
    with pytest.raises(ConfigError, match=r"^algorithm\.params\.order"):
        _run(_cfg(tmp_path, partition_cache, "splitfed_v2", {"order": "random"}))


# ------------------------------------------------------------------------------------ Ray
@pytest.mark.ray
@pytest.mark.parametrize("name", [*SPLIT_METHODS, "fedlogit", "fedla"])
def test_ray_two_workers_match_local_bit_for_bit(tmp_path, partition_cache, ray_session, name):
    local = _run(_cfg(tmp_path / "local", partition_cache, name))
    ray2 = _run(_cfg(tmp_path / "ray", partition_cache, name, engine__backend="ray", engine__num_workers=2))
    assert ray2.weights_hash == local.weights_hash
    if name in SPLIT_METHODS:
        assert ray2.rounds[-1]["split"]["workers"] == 2


@pytest.mark.ray
def test_worker_killed_during_split_iteration_is_recovered(tmp_path, partition_cache, ray_session):
    clean = _run(_cfg(tmp_path / "clean", partition_cache, "scala"))
    sampled = [int(c) for c in np.random.default_rng([0, 2]).choice(100, size=4, replace=False)]
    fault = {"kind": "exit", "round": 2, "client": sampled[2], "iteration": 1, "times": 1}
    faulty = _run(_cfg(tmp_path / "faulty", partition_cache, "scala", engine__backend="ray", engine__num_workers=2,
                       engine__fault_injection=fault))
    assert faulty.weights_hash == clean.weights_hash
    assert faulty.rounds[1]["worker_restarts"] == 1
    lost = [r for r in RunDir(faulty.run_dir).read_ledger().to_pylist() if r["failure"]]
    assert lost and all(r["round"] == 2 and "worker lost" in r["failure"] for r in lost)


def test_row_ce_gives_each_clients_mean_and_nan_for_a_client_without_rows():
    from fedray.algorithms.split import _row_ce

    g = torch.Generator().manual_seed(5)
    z, y = torch.randn(7, 4, generator=g), torch.randint(0, 4, (7,), generator=g)
    per = F.cross_entropy(z, y, reduction="none")
    got = _row_ce(z, y, [3, 0, 4])
    assert got[0] == float(per[:3].mean()) and math.isnan(got[1]) and got[2] == float(per[3:].mean())
    assert _row_ce(z, y, [7]) == [float(per.mean())]


def test_in_process_workers_hand_activations_and_gradients_over_as_tensors(tmp_path, partition_cache, monkeypatch):
    """LocalPool's workers share the coordinator's process: their activations and labels reach the server, and the
    gradient rows the clients, as tensors (on a GPU, no copy through host memory); Ray's arrive as numpy arrays
    (test_ray_two_workers_match_local_bit_for_bit: the same weights either way)."""
    from fedray.engine.client.split import SplitRuntime
    from fedray.engine.programs.split import SplitProgram

    uploads, rows = [], []
    serve, backward = SplitProgram._server_iteration, SplitRuntime._backward

    def spy_serve(self, r, group, outs, step):
        uploads.append({(type(outs[p].activations), type(outs[p].labels)) for p in group})
        return serve(self, r, group, outs, step)

    def spy_backward(self, st, g):
        rows.append(type(g))
        return backward(self, st, g)

    monkeypatch.setattr(SplitProgram, "_server_iteration", spy_serve)
    monkeypatch.setattr(SplitRuntime, "_backward", spy_backward)
    _run(_cfg(tmp_path, partition_cache, "scala", train__rounds=1))
    assert uploads and all(u == {(torch.Tensor, torch.Tensor)} for u in uploads)
    assert rows and all(t is torch.Tensor for t in rows)
