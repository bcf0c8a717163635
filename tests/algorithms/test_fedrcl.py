"""FedRCL and its family (FedSCL, FedCL) and FedRCL's client-side baselines (FitNet, MOON, FedLC, FedNTD,
FedDecorr, FedMLB, FedProc, FedDyn) and their composition with the server optimizers. The losses themselves
are tested in tests/losses/, the server optimizer formulas in test_server_opt.py.

End-to-end runs use the local backend and a tiny ``cnn_taps`` (2 rounds, 3 clients per round); two
algorithms are also run on Ray with 2 workers and must match the local run bit for bit; MOON and FedDyn
must keep their client state across rounds and across a driver crash + resume."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from fedray.algorithms import ALGORITHMS, build_algorithm
from fedray.algorithms.training import local_sgd
from fedray.config import ConfigError, from_dict
from fedray.driver.runner import run_experiment
from fedray.engine.state import ClientStateStore
from fedray.core.weights import FlatParams
from fedray.reporting.rundir import RunDir
from tests.algorithms.clients import tiny_taps_model as _tiny_model, toy_context as _ctx
from tests.helpers import ROOT, small_config

FAMILY = ["fedrcl", "fedscl", "fedcl", "fitnet", "moon", "fedlc", "fedntd", "feddecorr", "fedmlb", "fedproc", "feddyn"]
TINY = {"name": "cnn_taps", "params": {"widths": [8, 8, 16, 16]}}
# FedProc's weight alpha_r = 1 - (r-1)/(R-1) is 0 in the last round: with R = 2 it would be plain CE twice
ROUNDS = {"fedproc": 3}

pytestmark = pytest.mark.usefixtures("_cached_sources")  # tests/conftest.py


def _cfg(tmp_path: Path, partition_cache, alg: str, params: dict | None = None, **over) -> dict:
    base = dict(model=TINY, algorithm={"name": alg, "params": dict(params or {})},
                train__rounds=ROUNDS.get(alg, 2), train__clients_per_round=3, train__batch_size=20,
                data__partition={"name": "balanced_dirichlet", "num_clients": 100, "params": {"alpha": 0.3}},
                eval__every=100, eval__batch_size=1000)
    base.update(over)
    return small_config(tmp_path, partition_cache, **base)


def _run(cfg: dict, **kw):
    return run_experiment(from_dict(cfg), progress=False, log=lambda *a: None, **kw)


def _final_weights(res) -> np.ndarray:
    return np.load(res.run_dir / "final_weights.npy")


@pytest.fixture(scope="module")
def local_runs(tmp_path_factory, partition_cache):
    """Memoised local-backend runs: (algorithm, rounds) -> RunResult of the default tiny config."""
    memo = {}

    def get(alg: str, rounds: int | None = None):
        key = (alg, rounds)
        if key not in memo:
            over = {} if rounds is None else {"train__rounds": rounds}
            memo[key] = _run(_cfg(tmp_path_factory.mktemp(f"{alg}-first"), partition_cache, alg, **over))
        return memo[key]

    return get


# ------------------------------------------------------------------------------------ end to end
def test_registered_names():
    assert set(FAMILY) <= set(ALGORITHMS)


@pytest.mark.parametrize("alg", FAMILY)
def test_runs_end_to_end_and_is_deterministic(tmp_path, partition_cache, local_runs, alg):
    first = local_runs(alg)
    rounds = ROUNDS.get(alg, 2)
    assert [r["round"] for r in first.rounds] == list(range(1, rounds + 1))
    for r in first.rounds:
        assert r["dropped"] == [] and r["num_clients"] == 3, r
        assert np.isfinite(r["loss"]), r
    assert 0.0 <= first.accuracy <= 1.0
    again = _run(_cfg(tmp_path, partition_cache, alg))
    assert again.weights_hash == first.weights_hash
    # the method's loss changes the training: not the FedAvg result
    assert first.weights_hash != local_runs("fedavg", rounds).weights_hash


def test_fedrcl_penalty_changes_training_and_its_options_run(tmp_path, partition_cache, local_runs):
    """FedRCL differs from FedSCL (beta = 0) end to end; the paper variant and last-level-only option train."""
    assert local_runs("fedrcl").weights_hash != local_runs("fedscl").weights_hash
    for i, opts in enumerate(({"variant": "paper"}, {"levels": "last"})):
        res = _run(_cfg(tmp_path / str(i), partition_cache, "fedrcl", opts))
        assert all(np.isfinite(r["loss"]) for r in res.rounds)
        assert res.weights_hash != local_runs("fedrcl").weights_hash


@pytest.mark.ray
@pytest.mark.parametrize("alg", [*FAMILY, "fedprox"])
def test_ray_two_workers_match_local(tmp_path, partition_cache, local_runs, ray_session, alg):
    res = _run(_cfg(tmp_path, partition_cache, alg, engine__backend="ray", engine__num_workers=2,
                    engine__chunk_size=1))
    assert res.weights_hash == local_runs(alg).weights_hash


@pytest.mark.ray
@pytest.mark.parametrize("alg", ["moon", "feddyn"])
def test_client_state_read_back_on_ray_matches_local(tmp_path, partition_cache, ray_session, alg):
    """Clients that return in a later round read the state another worker wrote (run-directory store):
    2 Ray workers give the in-process run's weights."""
    over = dict(train__rounds=3, train__batch_size=50,
                data__partition={"name": "balanced_dirichlet", "num_clients": 20, "params": {"alpha": 0.3}})
    local = _run(_cfg(tmp_path / "local", partition_cache, alg, **over))
    ray_res = _run(_cfg(tmp_path / "ray", partition_cache, alg, **over, engine__backend="ray",
                        engine__num_workers=2, engine__chunk_size=1))
    ledger = RunDir(ray_res.run_dir).read_ledger().to_pylist()
    rounds_of: dict[int, set] = {}
    for row in ledger:
        rounds_of.setdefault(row["client"], set()).add(row["round"])
    assert any(len(r) > 1 for r in rounds_of.values())  # some client trained again from its stored state
    assert ray_res.weights_hash == local.weights_hash


def test_moon_and_feddyn_keep_client_state_across_rounds_and_resume(tmp_path, partition_cache):
    """20 clients, 3 per round, 3 rounds: clients 9 and 19 train in rounds 1 and 3 and client 17 in rounds 2
    and 3, so stored state is read again, across the checkpoint of round 2. A driver crash before round 3
    and a resume from that checkpoint give the uninterrupted run's weights."""
    over = dict(train__rounds=3, train__batch_size=50, output__checkpoint_every=2,
                data__partition={"name": "balanced_dirichlet", "num_clients": 20, "params": {"alpha": 0.3}})
    procs = {}
    for alg in ("moon", "feddyn"):  # start both crashing runs first: they run while the clean ones do
        cfg = _cfg(tmp_path / f"{alg}-crash", partition_cache, alg, **over,
                   engine__fault_injection={"kind": "driver_exit", "round": 3})
        path = tmp_path / f"{alg}-crash.json"
        path.write_text(json.dumps(cfg))
        code = ("import json; from fedray.config import from_dict; from fedray.driver.runner import run_experiment;"
                f"run_experiment(from_dict(json.load(open({str(path)!r}))), progress=False)")
        procs[alg] = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, cwd=ROOT)
    clean = {alg: _run(_cfg(tmp_path / f"{alg}-clean", partition_cache, alg, **over)) for alg in procs}
    for alg, proc in procs.items():
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 17, err[-2000:]  # the driver died hard before round 3
        run_dir = next((tmp_path / f"{alg}-crash" / "runs").iterdir())
        assert [r["round"] for r in RunDir(run_dir).read_metrics()] == [1, 2]
        res = run_experiment(resume=run_dir, progress=False, log=lambda *a: None)
        assert res.weights_hash == clean[alg].weights_hash, alg
        assert [r["round"] for r in RunDir(run_dir).read_metrics()] == [1, 2, 3]

        # state across rounds: some client trained in two rounds, and its state is on disk
        ledger = RunDir(clean[alg].run_dir).read_ledger().to_pylist()
        visits: dict[int, set[int]] = {}
        for row in ledger:
            visits.setdefault(row["client"], set()).add(row["round"])
        assert any(len(rs) > 1 for rs in visits.values()), visits
        store = ClientStateStore(RunDir(clean[alg].run_dir).state_path)
        for cid in visits:
            state = store.load(cid, 4)
            assert state is not None and set(state) == ({"prev"} if alg == "moon" else {"grad"}), (cid, state)


# ------------------------------------------------------------------------------------ server optimizers
@pytest.mark.parametrize("server, lr", [("fedavgm", 1.0), ("fedadam", 0.01), ("fedacg", 1.0)])
def test_server_optimizers_compose_with_fedrcl(tmp_path, partition_cache, local_runs, server, lr):
    res = _run(_cfg(tmp_path, partition_cache, "fedrcl", server={"name": server, "lr": lr}))
    assert all(np.isfinite(r["loss"]) and r["dropped"] == [] for r in res.rounds)
    assert res.weights_hash != local_runs("fedrcl").weights_hash


def test_fedacg_proximal_term_applies_to_any_algorithm(tmp_path, partition_cache):
    """FedACG with lam = 0 broadcasts w itself and steps to w + (avg - w): FedAvg + its client proximal term
    must then equal FedProx with mu = beta (same formula mu/2 ||theta - w||^2), up to float rounding."""
    prox = _run(_cfg(tmp_path / "prox", partition_cache, "fedprox", {"mu": 0.5}))
    acg = _run(_cfg(tmp_path / "acg", partition_cache, "fedavg",
                    server={"name": "fedacg", "params": {"lam": 0.0, "beta": 0.5}}))
    plain = _run(_cfg(tmp_path / "plain", partition_cache, "fedavg"))
    w_prox, w_acg, w_plain = _final_weights(prox), _final_weights(acg), _final_weights(plain)
    assert np.abs(w_acg - w_prox).max() < 1e-6
    assert np.abs(w_plain - w_prox).max() > 1e-4  # the proximal term does change the result


def test_feddyn_server_correction_matches_formula():
    cfg = from_dict(small_config(Path("/nonexistent"), Path("/nonexistent"), algorithm={"name": "feddyn"},
                                 data__partition={"name": "iid", "num_clients": 10, "params": {}}))
    algo = build_algorithm("feddyn", {"alpha": 0.1}, cfg)
    rng = np.random.default_rng(0)
    theta = rng.standard_normal(50).astype(np.float32)
    state = algo.init_state(theta)
    h = np.zeros(50)
    for rnd in (1, 2):
        algo.broadcast(rnd, theta, state)
        clients = [theta + 0.1 * rng.standard_normal(50).astype(np.float32) for _ in range(3)]
        avg = np.mean(clients, axis=0).astype(np.float32)
        new, state = algo.after_aggregate(rnd, avg, [{"cid": i, "num_samples": 5, "feddyn": 1} for i in range(3)], state,
                                          broadcast=theta)
        h = h - 0.1 / 10 * sum(c.astype(np.float64) - theta for c in clients)
        np.testing.assert_allclose(state["h"], h, rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(new, avg - h / 0.1, rtol=1e-5, atol=1e-6)
        theta = new
    assert algo.client_weight(5) == algo.client_weight(500) == 1.0


def test_feddyn_client_state_update():
    """g_k <- g_k - alpha (theta_k - theta_g), and a stored g_k enters the local objective as -<theta, g_k>."""
    algo = build_algorithm("feddyn", {"alpha": 0.1})
    model = _tiny_model()
    g = FlatParams(_tiny_model()).read()
    upd = algo.local_update(_ctx(model, g), {})
    np.testing.assert_allclose(upd.state["grad"], -0.1 * (upd.weights - g), rtol=1e-6, atol=1e-9)
    upd2 = algo.local_update(_ctx(model, g, state=upd.state), {})
    assert not np.array_equal(upd2.weights, upd.weights)  # the linear term changes the update
    np.testing.assert_allclose(upd2.state["grad"], upd.state["grad"] - 0.1 * (upd2.weights - g), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("projection", [True, False])
def test_moon_first_visit_equals_ce_and_state_is_the_trained_model(projection):
    """At a client's first visit the previous model is the global one: the contrastive term is the constant log 2,
    so MOON's update equals FedAvg's (on the same, projected or plain, model); the stored state is the trained
    weights."""
    algo = build_algorithm("moon", {"projection": projection, "proj_dim": 6})

    def model():
        return algo.adapt_model(_tiny_model())

    def ctx(**kw):
        c = _ctx(model(), g, **kw)
        c.model_factory = model
        return c

    g = FlatParams(model()).read()
    moon = algo.local_update(ctx(), {})
    avg = build_algorithm("fedavg", {}).local_update(ctx(), {})
    np.testing.assert_allclose(moon.weights, avg.weights, rtol=0, atol=1e-6)
    assert moon.loss == pytest.approx(avg.loss + np.log(2), rel=1e-4)
    np.testing.assert_array_equal(moon.state["prev"], moon.weights)
    second = build_algorithm("moon", {"projection": projection, "proj_dim": 6}).local_update(
        ctx(state=moon.state), {})
    assert not np.allclose(second.weights, avg.weights, atol=1e-6)


def test_moon_projection_head_matches_the_official_model_and_loss():
    """projection: true (the official ModelFedCon): h = the base model's pooled feature, z = l2(relu(l1(h))),
    logits = fc(z); L = CE(logits, y) + mu * mean_i -log(e^{cos(z,zg)/tau} / (e^{cos(z,zg)/tau} + e^{cos(z,zp)/tau})).
    The head (and not the base classifier) is in the averaged flat vector; a plain model is refused."""
    import torch.nn.functional as F

    algo = build_algorithm("moon", {"proj_dim": 6})
    names = [n for n, _, _, _ in FlatParams(algo.adapt_model(_tiny_model())).layout.slices()]
    assert {"proj_l1.weight", "proj_l2.bias", "proj_fc.weight"} <= set(names)
    assert not any(n.startswith(_tiny_model()._classifier_path + ".") for n in names)

    def model(seed):
        torch.manual_seed(seed)
        base = _tiny_model()
        for p in base.parameters():
            p.data.add_(torch.randn(p.shape) * 0.05)
        return algo.adapt_model(base)

    local, glob, prev = model(1), model(2), model(3)
    w_g, w_p = FlatParams(glob).read(), FlatParams(prev).read()
    ctx = _ctx(local, w_g, state={"prev": w_p})
    ctx.flat.load(FlatParams(model(1)).read())
    ctx.model_factory = lambda: algo.adapt_model(_tiny_model())
    x = torch.randn(5, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 1, 2, 1, 0])
    got = float(algo.make_loss(ctx, {})(local, x, y).detach())

    def official(m):  # h -> l1 -> relu -> l2 (= the projection) -> fc
        h = m.forward_features(x, ["pooled"])[1]["pooled"].flatten(1)
        z = m.proj_l2(F.relu(m.proj_l1(h)))
        return z, m.proj_fc(z)

    with torch.no_grad():
        z, logits = official(local)
        zg, _ = official(glob)
        zp, _ = official(prev)
        con = []
        for i in range(5):
            pos = torch.exp(F.cosine_similarity(z[i], zg[i], dim=0) / 0.5)
            neg = torch.exp(F.cosine_similarity(z[i], zp[i], dim=0) / 0.5)
            con.append(-torch.log(pos / (pos + neg)))
        ref = float(F.cross_entropy(logits, y) + 1.0 * torch.stack(con).mean())
    assert got == pytest.approx(ref, rel=1e-5)
    torch.testing.assert_close(local(x), logits)
    with pytest.raises(RuntimeError, match="projection: true"):
        algo.make_loss(_ctx(_tiny_model(), FlatParams(_tiny_model()).read()), {})


def test_fedproc_prototypes_are_per_class_means_of_client_means():
    algo = build_algorithm("fedproc", {}, from_dict(small_config(Path("/x"), Path("/x"), train__rounds=5)))
    extras = [{"cid": 0, "num_samples": 4, "protos": np.array([[1.0, 0.0], [0.0, 2.0]], np.float32),
               "proto_classes": np.array([0, 3])},
              {"cid": 1, "num_samples": 9, "protos": np.array([[3.0, 0.0]], np.float32), "proto_classes": np.array([0])}]
    w = np.zeros(3, np.float32)
    _, state = algo.after_aggregate(1, w, extras, {})
    np.testing.assert_array_equal(state["proto_classes"], [0, 3])
    np.testing.assert_allclose(state["prototypes"], [[2.0, 0.0], [0.0, 2.0]])
    payload = algo.broadcast(2, w, state)
    assert payload["proc_alpha"] == pytest.approx(0.75)  # 1 - (2-1)/(5-1)
    assert algo.broadcast(1, w, {}) == {}
    # a client's extras: class means of its embeddings under the trained model
    upd = algo.local_update(_ctx(_tiny_model(), FlatParams(_tiny_model()).read()), payload | {"prototypes": np.zeros((2, 8), np.float32)})
    assert list(upd.extras["proto_classes"]) == [0, 1, 2] and upd.extras["protos"].shape == (3, 8)


def _frozen_head_model():
    from fedray.models import build_model

    torch.manual_seed(0)
    return build_model("cnn_backbone_mlp", in_channels=1, image_size=28, num_classes=10, backbone="cnn4",
                       backbone_options={"channels": [4, 8], "embed_dim": 16}, hidden=12, freeze_backbone=True)


def test_fedproc_with_a_frozen_backbone_contrasts_the_trainable_head():
    """tap: auto resolves to the head's hidden layer (12-d) when the backbone is frozen, so the prototype contrast
    changes the trained head; on the frozen 16-d embedding (tap: embedding, the old choice) it has no gradient and
    the update equals the alpha-weighted CE alone."""
    cfg = from_dict(small_config(Path("/x"), Path("/x"), train__rounds=11))
    g = FlatParams(_frozen_head_model()).read()
    labels = np.arange(12) % 3

    def update(params, protos):
        algo = build_algorithm("fedproc", params, cfg)
        payload = {"prototypes": protos, "proto_classes": np.array([0, 1, 2]), "proc_alpha": 0.9}
        ctx = _ctx(_frozen_head_model(), g, labels=labels, rnd=2)
        ctx.model_factory = _frozen_head_model
        return algo.local_update(ctx, payload)

    rng = np.random.default_rng(1)
    auto_a = update({}, rng.normal(size=(3, 12)).astype(np.float32))
    auto_b = update({}, rng.normal(size=(3, 12)).astype(np.float32))
    assert auto_a.extras["protos"].shape == (3, 12)
    assert not np.array_equal(auto_a.weights, auto_b.weights)  # the contrast term moves the head
    emb_a = update({"tap": "embedding"}, rng.normal(size=(3, 16)).astype(np.float32))
    emb_b = update({"tap": "embedding"}, rng.normal(size=(3, 16)).astype(np.float32))
    assert emb_a.extras["protos"].shape == (3, 16)
    np.testing.assert_array_equal(emb_a.weights, emb_b.weights)  # no gradient through the frozen embedding


@pytest.mark.parametrize("reduce", ["mean", "sum"])
def test_fitnet_hint_matches_a_naive_reference(reduce):
    """L = CE + lam * mean over levels of the hint between the local and the frozen global model's un-pooled maps
    at every tap but 'embedding': 'mean' = mean over feature elements of the squared difference (default),
    'sum' = per-sample half sum of squares, batch mean. Reference: float64 loops over levels and samples."""
    import torch.nn.functional as F

    g = FlatParams(_tiny_model()).read()
    w = (g + np.random.default_rng(4).normal(0, 0.05, g.shape)).astype(np.float32)
    model = _tiny_model()
    ctx = _ctx(model, g)
    ctx.flat.load(w)
    loss_fn = build_algorithm("fitnet", {} if reduce == "mean" else {"reduce": "sum"}).make_loss(ctx, {})
    x = torch.randn(5, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([0, 1, 2, 1, 0])
    got = float(loss_fn(model, x, y).detach())

    glob = _tiny_model()
    FlatParams(glob).load(g)
    taps = [t for t in model.feature_taps if t != "embedding"]
    logits, fl = model.forward_features(x, taps)
    _, fg = glob.forward_features(x, taps)
    hints = []
    for t in taps:
        a, b = fl[t].detach().double().numpy(), fg[t].detach().double().numpy()
        if reduce == "mean":
            hints.append(np.mean((a - b) ** 2))
        else:
            hints.append(np.mean([0.5 * np.sum((a[i] - b[i]) ** 2) for i in range(a.shape[0])]))
    ref = float(F.cross_entropy(logits.detach().double(), y)) + 1e-3 * float(np.mean(hints))
    assert got == pytest.approx(ref, rel=1e-5)


def test_fedmlb_cuts_feed_the_server_parts():
    from fedray.algorithms.baselines import _branch_points, _forward_cuts

    model = _tiny_model()
    x = torch.randn(4, 1, 28, 28)
    points = _branch_points(model)
    assert points == ["l1", "l2", "l3", "l4", "l5"]
    logits, cuts = _forward_cuts(model, x, points)
    torch.testing.assert_close(logits, model(x), rtol=0, atol=0)
    for p in points:
        client, server = model.split(p)
        torch.testing.assert_close(cuts[p], client(x), rtol=0, atol=0)
        torch.testing.assert_close(server(cuts[p]), logits, rtol=0, atol=0)


# ------------------------------------------------------------------------------------ config errors
@pytest.mark.parametrize("alg, params, field", [
    ("fedrcl", {"tau": 0}, "tau"),
    ("fedrcl", {"beta": -1}, "beta"),
    ("fedrcl", {"lam": 2.0}, "lam"),
    ("fedrcl", {"variant": "eq5"}, "variant"),
    ("fedrcl", {"levels": "first"}, "levels"),
    ("fedrcl", {"weighting": "bytes"}, "weighting"),
    ("fedscl", {"beta": 1.0}, "beta"),
    ("fedcl", {"view_augment": ["blur"]}, "view_augment"),
    ("fedcl", {"view_augment": []}, "view_augment"),
    ("fitnet", {"lam": -0.1}, "lam"),
    ("moon", {"tau": 0.0}, "tau"),
    ("moon", {"temperature": 0.5}, "temperature"),
    ("fedlc", {"tau": "one"}, "tau"),
    ("fedntd", {"beta": 1.5}, "beta"),
    ("feddecorr", {"beta": -0.01}, "beta"),
    ("fedmlb", {"lam1": -1}, "lam1"),
    ("fedproc", {"tau": 0}, "tau"),
    ("feddyn", {"alpha": 0}, "alpha"),
    ("feddyn", {"weighting": "uniform"}, "weighting"),
])
def test_config_errors_name_the_parameter(alg, params, field):
    with pytest.raises(ConfigError, match=rf"^algorithm\.params\.{field}\b"):
        build_algorithm(alg, params)


def test_fedmlb_needs_a_model_with_split_points():
    cfg = from_dict(small_config(Path("/x"), Path("/x"), algorithm={"name": "fedmlb"}, model={"name": "mlp"}))
    with pytest.raises(ConfigError, match=r"^algorithm\.name: fedmlb needs a model with split points"):
        build_algorithm("fedmlb", {}, cfg)
    ok = from_dict(small_config(Path("/x"), Path("/x"), algorithm={"name": "fedmlb"}, model=TINY))
    build_algorithm("fedmlb", {}, ok)


def test_levels_last_and_list_form():
    a = build_algorithm("fedrcl", {"levels": ["last"]})
    assert a.params["levels"] == "last"
    from fedray.algorithms.fedrcl import level_taps

    assert level_taps(_tiny_model(), "last") == ["l5"]
    assert level_taps(_tiny_model(), "all") == ["l1", "l2", "l3", "l4", "l5"]


def test_fedrcl_local_step_is_ce_plus_multilevel_terms():
    """One local step of FedRCL minimises exactly CE + mean_l SCL_l + beta * mean_l PEN_l."""
    import torch.nn.functional as F

    from fedray.losses import multilevel_relaxed_contrastive_loss

    model = _tiny_model()
    g = FlatParams(_tiny_model()).read()
    ctx = _ctx(model, g)
    algo = build_algorithm("fedrcl", {"beta": 0.5})
    loss_fn = algo.make_loss(ctx, {})
    x = torch.randn(6, 1, 28, 28)
    y = torch.tensor([0, 0, 1, 1, 2, 2])
    logits, feats = model.forward_features(x, ["l1", "l2", "l3", "l4", "l5"])
    scl, pen = multilevel_relaxed_contrastive_loss([feats[t] for t in ("l1", "l2", "l3", "l4", "l5")], y, beta=0.5)
    expected = F.cross_entropy(logits, y) + scl + 0.5 * pen
    torch.testing.assert_close(loss_fn(model, x, y), expected)
    assert local_sgd(ctx, loss_fn) > 0
