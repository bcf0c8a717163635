"""Per-iteration overhead of fedray's split-learning program (SCALA) against the same training in one process.

Same configuration everywhere: ``jobs/configs/scala_mnist.yaml`` (mnist5k, 100 clients holding 2 classes,
10 per round, B = 320, 5 local iterations, SGD lr 0.01) with a CPU-sized ``alexnet_split``
(``channels [16, 32, 32, 64, 64]``, ``fc [128, 64]``) cut at ``block2``, and evaluation only at the last round
(its seconds are excluded). Implementations:

- ``fedray ray, N workers``: ``engine.backend: ray``, ``engine.num_workers: N``, 1 torch thread per worker;
  client-side parts on the workers, the server-side part on the coordinator actor, activations and
  gradient rows through Ray once per local iteration (fedray/engine/programs/split.py);
- ``fedray local``: ``engine.backend: local`` (in-process pool, same program, no Ray);
- ``one-process loop``: a hand-written plain-PyTorch SCALA loop doing the same arithmetic (same sampled
  clients, the same ``B_k``, iterations and model; minibatches drawn the same way but not bit-matched):
  per iteration every client forwards its client-side part, activations and labels are concatenated, the
  server-side part takes one step on ``CE(z + log P_s)``, each client back-propagates its rows of
  ``d/dA CE(z + log P_k)`` and steps; at round end the client-side parts are averaged by ``|D_k|``.
  ``torch.set_num_threads(1)``, so it compares with one worker.

Seconds per local iteration = (round wall seconds - eval seconds) / local iterations, over rounds 2..R
(round 1 holds the warm-up). fedray's figure is the driver's round wall time (``wall_seconds``: it includes
the coordinator call, sampling, broadcast, the final weight-return task and aggregation, like the loop's
round time). The coordinator round trip per iteration is ``fedray ray s/iter - one-process s/iter``.
Activation + gradient MB per iteration are what crosses the client/server cut (float32); only the Ray
backend serialises them. No assertions: figures only.

    .venv/bin/python bench/bench_split.py                       # 4 rounds, Ray with 1 and 2 workers
    .venv/bin/python bench/bench_split.py --rounds 3 --workers 2 --json bench/out/split.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("OMP_NUM_THREADS", "1")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from fedray.config import load_config  # noqa: E402

CONFIG = ROOT / "jobs" / "configs" / "scala_mnist.yaml"
MB = 1e6


def make_cfg(rounds: int, workdir: Path, extra: list[str]):
    overrides = [
        "model.params={channels: [16, 32, 32, 64, 64], fc: [128, 64]}",
        "data.partition.num_clients=100",
        "data.partition.params={classes: 2}",
        "train.clients_per_round=10",
        "algorithm.params.batch_size=320",
        "algorithm.params.local_iters=5",
        f"train.rounds={rounds}",
        f"eval.every={10 ** 6}",
        "engine.device=cpu",
        "engine.torch_threads=1",
        f"output.root={workdir / 'runs'}",
        f"data.cache_dir={workdir / 'partitions'}",
        "output.checkpoint_every=0",
        "output.tensorboard=false",
        "output.progress=false",
        *extra,
    ]
    return load_config(CONFIG, overrides)


# ------------------------------------------------------------------------------------------- fedray
def run_fedray(rounds: int, workdir: Path, extra: list[str]) -> dict:
    from fedray.driver.runner import run_experiment

    cfg = make_cfg(rounds, workdir, extra)
    res = run_experiment(cfg, progress=False, log=lambda *a: None, overwrite=True)
    per_iter, parts, mb = [], {"clients": [], "server": [], "other": []}, []
    for r in res.rounds[1:]:  # rounds 2..R
        secs = r["seconds"]
        iters = int(r["split"]["iterations"])
        wall = float(r["wall_seconds"]) - float(secs.get("eval", 0.0))
        per_iter.append(wall / iters)
        parts["clients"].append(secs["clients"] / iters)
        parts["server"].append(secs["server"] / iters)
        parts["other"].append((wall - secs["clients"] - secs["server"]) / iters)
        b = r["bytes"]
        mb.append((b["activations"] + b["gradients"]) / iters / MB)
    return {"s_per_iter": statistics.mean(per_iter), "per_round": per_iter,
            "breakdown": {k: statistics.mean(v) for k, v in parts.items()}, "mb_per_iter": statistics.mean(mb),
            "startup_s": res.startup_seconds, "workers": res.rounds[-1]["split"]["workers"]}


# ------------------------------------------------------------------------------------------- one process
def run_loop(rounds: int, workdir: Path, cfg=None, device: str = "cpu") -> dict:
    """SCALA in plain PyTorch, one process, one thread (same data, clients, B_k and model as fedray). ``cfg``: another
    configuration of the same program (default this benchmark's, in-process); ``device``: where the models and the
    minibatches live (bench/gpu/gpu_bench.py runs it on the GPU; the timers then synchronise the device)."""
    from fedray.data.loader import to_float
    from fedray.driver.setup import prepare_data
    from fedray.engine.split_layout import batch_plan, batch_sizes
    from fedray.losses import label_prior, logit_adjusted_ce
    from fedray.models.registry import build_model

    torch.set_num_threads(1)
    if cfg is None:
        cfg = make_cfg(rounds, workdir, ["engine.backend=local"])
    dev = torch.device(device)

    def now() -> float:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter()

    _, store = prepare_data(cfg)
    meta = store.meta
    sizes_all = np.asarray(store.sizes, np.int64)
    counts_all = store.class_counts()
    nc = int(meta.num_classes)
    p = cfg.algorithm.params
    B, iters, K = int(p["batch_size"]), int(p["local_iters"]), int(cfg.train.clients_per_round)
    eps, zm = float(p.get("eps", 1e-9)), p.get("zero_mode", "clamp")
    point = p.get("split_point") or "block2"
    t = cfg.train
    normalize = bool(cfg.data.normalize)

    torch.manual_seed(int(cfg.seed))
    c, h, w = (int(s) for s in meta.shape)
    model = build_model(cfg.model.name, in_channels=c, image_size=(h, w), num_classes=nc, **cfg.model.params).to(dev)
    g_client, server = model.split(point)
    replicas = [copy.deepcopy(model).split(point)[0] for _ in range(K)]
    s_params = [q for q in server.parameters() if q.requires_grad]
    s_opt = torch.optim.SGD(s_params, lr=t.lr, momentum=t.momentum, weight_decay=t.weight_decay)  # persists
    server.train()

    per_iter, mb = [], []
    parts = {"clients": [], "server": [], "other": []}
    for rnd in range(1, rounds + 1):
        t0 = now()
        t_cl = t_sv = 0.0
        sampled = np.random.default_rng([int(cfg.seed), rnd]).choice(len(sizes_all), size=K, replace=False)
        sizes = sizes_all[sampled]
        bks = batch_sizes(sizes, B)
        lr = float(t.lr) * float(t.lr_decay) ** (rnd - 1)
        for group in s_opt.param_groups:
            group["lr"] = lr
        clients = []
        for k, cid in enumerate(sampled):
            images, labels = store.client_arrays(int(cid))
            part = replicas[k]
            with torch.no_grad():
                for dst, src in zip(part.parameters(), g_client.parameters()):
                    dst.copy_(src)
            part.train()
            opt = torch.optim.SGD(list(part.parameters()), lr=lr, momentum=t.momentum, weight_decay=t.weight_decay)
            plan = batch_plan(np.random.default_rng([int(cfg.seed), rnd, int(cid)]), len(labels), int(bks[k]), iters)
            prior = torch.as_tensor(counts_all[cid] / max(counts_all[cid].sum(), 1), dtype=torch.float32, device=dev)
            clients.append((part, opt, plan, images, labels, prior))
        nbytes = 0
        for it in range(iters):
            t1 = now()
            outs, acts, ys, priors = [], [], [], []
            for part, opt, plan, images, labels, prior in clients:
                idx = plan[it]
                xb = to_float(torch.from_numpy(np.ascontiguousarray(images[idx])), meta, normalize).to(dev)
                yb = torch.from_numpy(np.ascontiguousarray(labels[idx], dtype=np.int64)).to(dev)
                out = part(xb)
                outs.append(out)
                acts.append(out.detach())
                ys.append(yb)
                priors.append(prior.expand(len(yb), nc))
            t2 = now()
            t_cl += t2 - t1
            a = torch.cat(acts, 0).requires_grad_(True)
            y = torch.cat(ys, 0)
            z = server(a)
            loss_s = logit_adjusted_ce(z, y, label_prior(y, nc), eps=eps, zero_mode=zm)  # Eq. 14
            loss_c = logit_adjusted_ce(z, y, torch.cat(priors, 0), eps=eps, zero_mode=zm)  # Eq. 15
            (ga,) = torch.autograd.grad(loss_c, (a,), retain_graph=True)  # at the pre-step server weights
            grads = torch.autograd.grad(loss_s, s_params)
            for q, gq in zip(s_params, grads):
                q.grad = gq
            if t.grad_clip is not None:
                torch.nn.utils.clip_grad_norm_(s_params, float(t.grad_clip))
            s_opt.step()
            rows = torch.split(ga, [len(v) for v in ys], 0)
            t3 = now()
            t_sv += t3 - t2
            nbytes += a.numel() * a.element_size() + ga.numel() * ga.element_size()
            for (part, opt, *_), out, g in zip(clients, outs, rows):
                opt.zero_grad(set_to_none=True)
                out.backward(g)
                if t.grad_clip is not None:
                    torch.nn.utils.clip_grad_norm_(list(part.parameters()), float(t.grad_clip))
                opt.step()
            t_cl += now() - t3
        total = float(sizes.sum())
        with torch.no_grad():  # weighted average of the client-side parts, folded in sampled order
            for j, dst in enumerate(g_client.parameters()):
                acc = None
                for k, (part, *_) in enumerate(clients):
                    v = list(part.parameters())[j] * (float(sizes[k]) / total)
                    acc = v if acc is None else acc.add_(v)
                dst.copy_(acc)
        wall = now() - t0
        if rnd > 1:
            per_iter.append(wall / iters)
            mb.append(nbytes / iters / MB)
            parts["clients"].append(t_cl / iters)
            parts["server"].append(t_sv / iters)
            parts["other"].append((wall - t_cl - t_sv) / iters)
    return {"s_per_iter": statistics.mean(per_iter), "per_round": per_iter, "mb_per_iter": statistics.mean(mb),
            "breakdown": {k: statistics.mean(v) for k, v in parts.items()}}


# ------------------------------------------------------------------------------------------- main
def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4, help="rounds per run (rounds 2..R are timed)")
    ap.add_argument("--workers", default="1 2", help="Ray worker counts, e.g. '1 2'")
    ap.add_argument("--json", default=None, help="also write the figures to this JSON file")
    args = ap.parse_args(argv)
    if args.rounds < 2:
        ap.error("--rounds must be >= 2 (round 1 is warm-up)")
    workers = [int(w) for w in args.workers.replace(",", " ").split()]

    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="fedray-bench-split-") as tmp:
        work = Path(tmp)
        print(f"SCALA split learning, {args.rounds} rounds (rounds 2..{args.rounds} timed), torch "
              f"{torch.__version__}, {len(os.sched_getaffinity(0))} CPUs", file=sys.stderr)
        results["one-process loop"] = run_loop(args.rounds, work)
        results["fedray local"] = run_fedray(args.rounds, work, ["engine.backend=local", "engine.num_workers=1"])
        try:
            for n in workers:
                results[f"fedray ray, {n} worker{'s' if n > 1 else ''}"] = run_fedray(
                    args.rounds, work, ["engine.backend=ray", f"engine.num_workers={n}"])
        finally:
            if "ray" in sys.modules:
                import ray

                if ray.is_initialized():
                    ray.shutdown()

    base = results["one-process loop"]["s_per_iter"]
    print(f"\nSCALA on mnist5k, alexnet_split [16,32,32,64,64]/[128,64] cut at block2, 10 of 100 clients, "
          f"B=320, 5 local iterations; rounds 2..{args.rounds}\n")
    print("| implementation | s per local iteration | overhead ms/iter | ratio | act+grad MB/iter |")
    print("|---|---:|---:|---:|---:|")
    for name, r in results.items():
        s = r["s_per_iter"]
        r["overhead_ms"] = 1000 * (s - base)
        r["ratio"] = s / base
        print(f"| {name} | {s:.4f} | {r['overhead_ms']:+.1f} | {r['ratio']:.2f} | {r['mb_per_iter']:.2f} |")
    print("\nper-iteration breakdown (s): clients = client forward/backward/step (fedray: worker tasks incl. "
          "transfer), server = concat + server step, other = sampling, broadcast, aggregation, driver round trip")
    print("| implementation | clients | server | other |")
    print("|---|---:|---:|---:|")
    for name, r in results.items():
        if "breakdown" in r:
            b = r["breakdown"]
            print(f"| {name} | {b['clients']:.4f} | {b['server']:.4f} | {b['other']:.4f} |")
    print()
    for name, r in results.items():
        if name.startswith("fedray ray"):
            rt = r["s_per_iter"] - base
            r["coordinator_round_trip_ms"] = 1000 * rt
            print(f"coordinator round trip per iteration ({name}): {1000 * rt:.1f} ms")
    if args.json:
        out = {"rounds": args.rounds, "workers": workers, "results": results}
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
