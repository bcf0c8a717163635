"""fedray.algorithms.base: the shared client-side pieces (the broadcast proximal term)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedray.algorithms.training import broadcast_proximal_term
from fedray.config import TrainConfig
from fedray.core.weights import FlatParams
from tests.algorithms.clients import tiny_taps_model as _tiny_model, toy_context as _ctx


def test_broadcast_proximal_term_value():
    model = _tiny_model()
    g = FlatParams(_tiny_model()).read()
    ctx = _ctx(model, g, prox_mu=0.3)
    w = g + np.random.default_rng(1).standard_normal(g.shape).astype(np.float32) * 0.01
    ctx.flat.load(w)
    params = [p for p in model.parameters() if p.requires_grad]
    term = broadcast_proximal_term(ctx, params)
    assert float(term().detach()) == pytest.approx(0.5 * 0.3 * float(np.sum((w.astype(np.float64) - g) ** 2)), rel=1e-5)
    assert broadcast_proximal_term(_ctx(model, g, prox_mu=0.0), params) is None


@pytest.mark.parametrize("kind", ["fedprox", "fedacg"])
def test_default_proximal_pull_equals_the_lab_codes_unhalved_term(kind):
    """The FedRCL/FedACG lab code adds 1e-3 * sum ||theta - theta_anchor||^2 (no 1/2): fedray's default mu
    (FedProx) / beta (FedACG) in its mu/2 form gives exactly that term, value and gradient."""
    from fedray.algorithms import build_algorithm
    from fedray.algorithms.server_opt import build_server_optimizer

    hints = (build_algorithm("fedprox", {}) if kind == "fedprox" else build_server_optimizer("fedacg", 1.0)).client_hints()
    model = _tiny_model()
    w = FlatParams(model).read()
    g = (w + np.random.default_rng(3).normal(0, 0.1, w.shape)).astype(np.float32)
    ctx = _ctx(model, g, prox_mu=hints.prox_mu)
    ctx.flat.load(w)
    params = [p for p in model.parameters() if p.requires_grad]
    term = broadcast_proximal_term(ctx, params)()
    anchors = ctx.flat.layout  # the naive lab-code term, parameter by parameter in float64
    ref = 0.0
    for name, p in model.named_parameters():
        off, n = next((o, k) for nm, _, o, k in anchors.slices() if nm == name)
        ref += 1e-3 * float(np.sum((p.detach().double().numpy().ravel() - g[off:off + n].astype(np.float64)) ** 2))
    assert float(term.detach()) == pytest.approx(ref, rel=1e-5)
    (grad,) = torch.autograd.grad(term, [params[0]])
    off, n = next((o, k) for nm, _, o, k in anchors.slices() if nm == next(iter(dict(model.named_parameters()))))
    want = 2e-3 * (params[0].detach().numpy().ravel() - g[off:off + n])
    np.testing.assert_allclose(grad.numpy().ravel(), want, rtol=1e-4, atol=1e-9)


def _keyed_stream(seed, rnd, cid, n, bs, steps, drop_last=False):
    """The batches a client must train on with train.local_steps: consecutive keyed epoch permutations
    (np.random.default_rng([seed, round, client])) cut into batches, the first `steps` of them."""
    rng = np.random.default_rng([seed, rnd, cid])
    stop = (n // bs) * bs if drop_last else n
    out = []
    while len(out) < steps:
        perm = rng.permutation(n)
        out += [perm[i:i + bs] for i in range(0, stop, bs)]
    return out[:steps]


@pytest.mark.parametrize("steps,drop_last", [(1, False), (5, False), (7, True), (3, False)])
def test_local_steps_takes_exactly_t_steps_on_the_keyed_batches(steps, drop_last):
    """train.local_steps = T: exactly T optimizer steps, on the first T batches of the client's keyed epoch
    permutations (crossing epoch boundaries; 10 rows, batch 4: 3 batches an epoch, 2 with drop_last);
    local_epochs is ignored."""
    from fedray.algorithms.training import batch_schedule, local_sgd

    model = _tiny_model()
    g = FlatParams(model).read()
    ctx = _ctx(model, g, labels=np.arange(10) % 3, rnd=4)
    ctx.train = TrainConfig(batch_size=4, lr=0.05, local_epochs=9, local_steps=steps, drop_last=drop_last)
    want = _keyed_stream(0, 4, 3, 10, 4, steps, drop_last)
    got = list(batch_schedule(ctx))
    assert len(got) == steps and all(np.array_equal(a, b) for a, b in zip(got, want))
    seen = []

    def loss_fn(m, x, y):
        seen.append(y.clone())
        return torch.nn.functional.cross_entropy(m(x), y)

    local_sgd(ctx, loss_fn)
    assert len(seen) == steps
    for y, idx in zip(seen, want):
        assert y.tolist() == ctx.labels[idx].tolist()


def test_local_steps_equal_to_the_epoch_schedule_reproduces_it():
    """T = epochs x batches per epoch gives the epoch schedule exactly (same batches, same trained weights)."""
    from fedray.algorithms import build_algorithm
    from fedray.algorithms.training import batch_schedule

    g = FlatParams(_tiny_model()).read()
    runs = []
    for train in (TrainConfig(batch_size=4, lr=0.05, local_epochs=2), TrainConfig(batch_size=4, lr=0.05, local_steps=6)):
        ctx = _ctx(_tiny_model(), g, labels=np.arange(10) % 3)
        ctx.train = train
        runs.append(([b.tolist() for b in batch_schedule(ctx)], build_algorithm("fedavg", {}).local_update(ctx, {})))
    assert runs[0][0] == runs[1][0] and len(runs[0][0]) == 6
    np.testing.assert_array_equal(runs[0][1].weights, runs[1][1].weights)


@pytest.mark.parametrize("name,momentum,wd", [("sgd", 0.0, 0.0), ("sgd", 0.9, 1e-4), ("adam", 0.0, 1e-4)])
def test_client_optimizers_are_torchs_bit_for_bit(name, momentum, wd):
    """make_torch_optimizer's optimizers (whose step skips torch's dynamo wrapper) are torch.optim.SGD / Adam:
    the same parameters, bit for bit, after steps with zero_grad and a state_dict round trip between them."""
    from fedray.algorithms.training import make_torch_optimizer

    train = TrainConfig(optimizer=name, momentum=momentum, weight_decay=wd, lr=0.05)
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)))
    ours = make_torch_optimizer(train, models[0].parameters(), 0.05)
    cls = torch.optim.Adam if name == "adam" else torch.optim.SGD
    theirs = cls(models[1].parameters(), lr=0.05, weight_decay=wd, **({} if name == "adam" else {"momentum": momentum}))
    assert isinstance(ours, cls)
    g = torch.Generator().manual_seed(1)
    for step in range(6):
        x, y = torch.randn(10, 8, generator=g), torch.randint(0, 3, (10,), generator=g)
        for model, opt in zip(models, (ours, theirs)):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if step == 2:
                opt.load_state_dict(opt.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(*(m.parameters() for m in models)))


def test_client_optimizer_hooks_and_profiler_still_run():
    """The step of make_torch_optimizer's optimizers skips torch's hook/profiler wrapper only when there is nothing
    for it to do: an instance hook, a global hook and a torch profiler each still see every step (and zero_grad's
    range under the profiler), and the parameters stay those of torch's own SGD."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from fedray.algorithms.training import make_torch_optimizer

    model = torch.nn.Linear(4, 2)
    opt = make_torch_optimizer(TrainConfig(optimizer="sgd", lr=0.1), model.parameters(), 0.1)
    seen = []

    def train(n):
        for _ in range(n):
            opt.zero_grad()
            model(torch.ones(3, 4)).sum().backward()
            opt.step()

    handle = opt.register_step_pre_hook(lambda o, args, kwargs: seen.append("own"))
    train(2)
    handle.remove()
    handle = register_optimizer_step_post_hook(lambda o, args, kwargs: seen.append("global"))
    try:
        train(1)
    finally:
        handle.remove()
    train(1)
    assert seen == ["own", "own", "global"]
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        train(2)
    names = [e.name for e in prof.events()]
    assert names.count("Optimizer.step#SGD.step") == 2 and names.count("Optimizer.zero_grad#SGD.zero_grad") == 2
    assert all(p.grad is not None for p in model.parameters())
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


DYNAMO_FREE = """
import sys
import torch
from fedray.algorithms.training import make_torch_optimizer
from fedray.config import TrainConfig
for name in ("sgd", "adam"):
    model = torch.nn.Linear(4, 2)
    opt = make_torch_optimizer(TrainConfig(optimizer=name, momentum=0.9, weight_decay=1e-4), model.parameters(), 0.1)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
    opt.load_state_dict(opt.state_dict())
print("torch._dynamo" in sys.modules)
"""


def test_client_optimizers_do_not_import_dynamo():
    """torch's optimizers import torch._dynamo (1.3 CPU-s, 70 MB) at their first call; a fresh process that trains
    with fedray's never does (a cold run's client workers paid it in round 1)."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", DYNAMO_FREE], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"


def test_client_rng_streams_are_those_of_the_key_list():
    """ClientContext.rng hands SeedSequence a uint32 array when the key fits 32 bits (faster); every stream must be
    the one of ``np.random.default_rng(key_list)``, the key's definition, for small, 32-bit-edge and wider seeds."""
    from fedray.algorithms.context import ClientContext
    from fedray.core.seeds import PURPOSES

    for seed in (0, 7, 2**32 - 1, 2**32, 2**40 + 3):
        for rnd, cid in ((1, 0), (12, 9_999_999), (2**31, 2**32 - 1)):
            ctx = ClientContext(cid=cid, rnd=rnd, seed=seed, model=None, flat=None, global_weights=None, images=None,
                                labels=np.zeros(0, dtype=np.int64), meta=None, train=None, device=torch.device("cpu"),
                                normalize=False)
            assert np.array_equal(ctx.rng("order").permutation(50), np.random.default_rng([seed, rnd, cid]).permutation(50))
            for purpose in ("dropout", "augment"):
                key = [seed, rnd, cid, 1000 + PURPOSES[purpose]]
                assert np.array_equal(ctx.rng(purpose).random(5), np.random.default_rng(key).random(5))
                assert np.array_equal(ctx.rng(purpose, 3, 2**33).random(5),
                                      np.random.default_rng(key + [3, 2**33]).random(5))


def test_loss_sums_kept_in_tensors_are_the_hosts_numbers():
    # on a GPU local_sgd and multi-client training keep the running loss on the device (no host sync a step);
    # the tensor path must give the float64 host path's numbers exactly (the reported train loss keeps its bits)
    from fedray.algorithms.training import LossSum

    g = torch.Generator().manual_seed(7)
    losses = torch.rand(200, generator=g, dtype=torch.float32) * 3
    counts = torch.randint(1, 65, (200,), generator=g).tolist()
    host, tens = LossSum("cpu"), LossSum("cpu", in_tensors=True)
    assert not host.on_device and tens.on_device
    for v, c in zip(losses, counts):
        host.add(v, c)
        tens.add(v, c)
    assert host.value() == tens.value()
    assert host.value() != float(sum(losses.double() * torch.tensor(counts, dtype=torch.float64)).float())
    rows_h, rows_t = LossSum("cpu", rows=5), LossSum("cpu", rows=5, in_tensors=True)
    for step in range(40):  # a stack that shrinks: rows 0..a-1
        a = 5 - step // 10
        v = torch.rand(a, generator=g, dtype=torch.float32)
        c = torch.randint(1, 33, (a,), generator=g).tolist()
        rows_h.add_rows(v, c)
        rows_t.add_rows(v, c)
    assert [rows_h.value(r) for r in range(5)] == [rows_t.value(r) for r in range(5)]


def test_local_training_on_batches_gathered_on_the_device_gives_the_same_weights(tmp_path, partition_cache,
                                                                                 monkeypatch):
    """local_sgd's batches gathered from a client's rows copied to the device once (what an accelerator gets,
    loader.train_batches) train to the same weights as batches copied one by one: forced on the CPU here."""
    from fedray.config import from_dict
    from fedray.data import loader
    from fedray.driver.runner import run_experiment
    from tests.helpers import small_config

    def run(tag, resident):
        original = loader.train_batches
        calls = []

        def forced(*a, **k):
            calls.append(resident)
            return original(*a, **{**k, "resident": resident})

        monkeypatch.setattr(loader, "train_batches", forced)
        cfg = small_config(tmp_path / tag, partition_cache)
        cfg["train"]["rounds"] = 2
        r = run_experiment(from_dict(cfg), progress=False, log=lambda *a: None)
        assert calls and set(calls) == {resident}
        return r.weights_hash, [row["loss"] for row in r.rounds]

    assert run("gathered", True) == run("copied", False)
