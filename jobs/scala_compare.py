"""Reproduce SCALA's headline comparison at CPU scale: FedAvg, FedLogit, SplitFedV1, SplitFedV2, SCALA.

    python -m jobs.scala_compare                    # mnist5k, paper-width alexnet_split, 50 rounds (GPU: minutes)
    python -m jobs.scala_compare --small-model      # narrower alexnet (CPU: ~30 min on 2 cores)
    python -m jobs.scala_compare --quick            # smoke run (~2-3 min on 2 cores): 3 rounds, 2 local iterations
    python -m jobs.scala_compare --backend ray --workers 4 --device cuda

Setting (SCALA §5 on the embedded MNIST subset): 100 clients, 10% per round, label skew by
``classes_per_client`` (each client holds α = 2 classes) and by Dirichlet (β = 0.05, ``dirichlet``
partitioner; clients left empty by so small a β are never sampled); AlexNet-style CNN cut after its first
6 layers (``alexnet_split``, split point ``block2``); SGD lr 0.01. Split methods: B = 320 split across the
round's clients in proportion to their data, 5 local iterations per round. FL baselines (FedAvg,
FedLogit = FedAvg with SCALA's Eq. 15 as local loss) take T local iterations per round as in SCALA's Table 7
(``train.local_steps = T``, T = ``--fl-steps``, default the split methods' local iterations), batch 32
(about B_k = 320 / 10 clients).

Outputs under ``--out`` (default ``runs/scala_compare``): one run directory per (method, partition) in
``runs/``, ``scala_compare.md`` (settings + a method × partition table: final / EMA-0.9 / best accuracy and
the communication per round: weights vs activations + gradients), and ``fedray report`` outputs
(``summary.md``, ``summary.csv``, ``accuracy.png``, ``loss.png``) for all runs in ``report/`` and per
partition in ``report/<partition>/``.

With ``--backend local`` (default) runs execute as ``--parallel`` separate processes (default: CPU cores,
at most 2), each with the in-process engine; ``--backend ray`` runs them one after the other on Ray with
``--workers`` client workers (a cluster: connect with ``RAY_ADDRESS``); the split methods' server-side
model sits in the coordinator (on a GPU with ``--device cuda``).
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

METHODS = ("fedavg", "fedlogit", "splitfed_v1", "splitfed_v2", "scala")
SPLIT = ("splitfed_v1", "splitfed_v2", "scala")
PARTITIONS = {
    "cpc2": ("classes_per_client", {"classes": 2}, "#C = 2 (classes_per_client)"),
    "dir0.05": ("dirichlet", {"alpha": 0.05}, "Dirichlet β = 0.05"),
}
SMALL_MODEL = {"channels": [16, 32, 32, 64, 64], "fc": [128, 64]}


def local_iters(args) -> int:
    """The split methods' local iterations per round."""
    return 2 if args.quick else 5


def fl_steps(args) -> int:
    """T, the FL baselines' local iterations per round (default: the split methods')."""
    return int(args.fl_steps) if args.fl_steps is not None else local_iters(args)


def experiment_config(method: str, part: str, args) -> dict:
    """The config dict of one run of the comparison."""
    quick = bool(args.quick)
    rounds = args.rounds if args.rounds is not None else (3 if quick else 50)
    pname, pparams, _ = PARTITIONS[part]
    iters = local_iters(args)
    if method in SPLIT:
        params = {"batch_size": 320, "local_iters": iters}
        train = {"local_epochs": 1, "batch_size": 32}
    else:  # T local iterations (SCALA's Table 7), not epochs
        params = {}
        train = {"local_steps": fl_steps(args), "batch_size": 32}
    return {
        "seed": int(args.seed),
        "data": {
            "source": args.source,
            "root": args.data_root,
            "normalize": True,
            "cache_dir": str(Path(args.out) / "_partitions"),
            "partition": {"name": pname, "num_clients": 100, "params": dict(pparams)},
        },
        "model": {"name": "alexnet_split", "params": dict(SMALL_MODEL) if (quick or args.small_model) else {}},
        "algorithm": {"name": method, "params": params},
        "server": {"name": "none"},
        "train": {"rounds": int(rounds), "clients_per_round": 10, "optimizer": "sgd", "lr": float(args.lr),
                  "momentum": 0.0, "weight_decay": 0.0, **train},
        "eval": {"every": 1 if quick else int(args.eval_every), "ema": 0.9},
        "engine": {"backend": args.backend, "num_workers": args.workers, "torch_threads": int(args.threads),
                   "device": args.device},
        "output": {"root": str(Path(args.out) / "runs"), "name": f"{method}-{part}", "checkpoint_every": 10,
                   "tensorboard": False, "progress": False},
    }


def _run_one(cfg_dict: dict) -> dict:
    """Run one experiment (in this process) and return a short summary."""
    from fedray.config import from_dict
    from fedray.engine.runner import run_experiment

    t0 = time.perf_counter()
    res = run_experiment(from_dict(cfg_dict), progress=False, log=lambda *a: None, overwrite=True)
    return {"run_dir": str(res.run_dir), "accuracy": res.accuracy, "seconds": time.perf_counter() - t0}


def _mb(x) -> str:
    return "–" if x is None else f"{x / 1e6:.2f}"


def comparison_table(run_dirs: dict, methods, parts) -> str:
    """Markdown: one row per method; per partition the final / EMA-0.9 / best accuracy and the mean
    communication per round in MB (client-side weights down + up, and activations + gradients)."""
    from fedray.reporting.rundir import RunDir

    head = ["method"]
    for p in parts:
        head += [f"acc {p}", f"EMA {p}", f"best {p}"]
    head += ["weights MB/round", "acts+grads MB/round"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def fmt(v):
        return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.4f}"

    for m in methods:
        cells = [m]
        comm_w = comm_a = None
        for p in parts:
            rows = RunDir(run_dirs[(m, p)]).read_metrics()
            acc = [r["accuracy"] for r in rows if r.get("accuracy") is not None]
            ema = [r["ema_accuracy"] for r in rows if r.get("ema_accuracy") is not None]
            cells += [fmt(acc[-1] if acc else None), fmt(ema[-1] if ema else None), fmt(max(acc) if acc else None)]
            if comm_w is None and rows:
                b = [r.get("bytes", {}) for r in rows]
                comm_w = sum(x.get("broadcast", 0) + x.get("upload", 0) for x in b) / len(b)
                comm_a = sum(x.get("activations", 0) + x.get("labels", 0) + x.get("gradients", 0) for x in b) / len(b)
        cells += [_mb(comm_w), _mb(comm_a)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.scala_compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=None, help="rounds per run (default 50, --quick 3)")
    ap.add_argument("--out", default="runs/scala_compare", help="output directory")
    ap.add_argument("--quick", action="store_true",
                    help="smoke mode: 3 rounds, 2 local iterations (split and FL), narrow model")
    ap.add_argument("--small-model", action="store_true", help=f"narrow alexnet_split {SMALL_MODEL} for CPU runs")
    ap.add_argument("--source", default="mnist5k", help="data source (e.g. cifar10 with --data-root)")
    ap.add_argument("--data-root", default=None, help="directory of on-disk datasets (data.root)")
    ap.add_argument("--partitions", nargs="+", default=list(PARTITIONS), choices=list(PARTITIONS))
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--lr", type=float, default=0.01, help="SGD learning rate (paper: 0.01)")
    ap.add_argument("--fl-steps", type=int, default=None,
                    help="T: local iterations of the FL baselines per round, batch 32 (default: the split methods' "
                         "local iterations, 5; --quick 2)")
    ap.add_argument("--eval-every", type=int, default=1, help="evaluate every k rounds")
    ap.add_argument("--backend", choices=["local", "ray"], default="local")
    ap.add_argument("--parallel", type=int, default=None,
                    help="local backend: runs at once, in separate processes (default: CPU cores, at most 2)")
    ap.add_argument("--workers", type=int, default=None, help="ray backend: client workers per run")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per client worker / coordinator")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from fedray.config import ConfigError, from_dict
    from fedray.data.table import DataError

    if args.rounds is not None and args.rounds < 1:
        print("jobs.scala_compare: error: --rounds: must be >= 1", file=sys.stderr)
        return 2
    if (args.fl_steps is not None and args.fl_steps < 1) or args.eval_every < 1:
        print("jobs.scala_compare: error: --fl-steps and --eval-every must be >= 1", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.backend == "local":
        args.workers = 1
    jobs = [(m, p) for p in args.partitions for m in args.methods]
    cfgs = {key: experiment_config(*key, args) for key in jobs}
    try:  # validate every config and build each partition once, before any training starts
        from fedray.algorithms import build_algorithm
        from fedray.engine.runner import prepare_data

        built = set()
        for key, c in cfgs.items():
            cfg = from_dict(c)
            build_algorithm(cfg.algorithm.name, cfg.algorithm.params, cfg)
            if key[1] not in built:
                prepare_data(cfg)
                built.add(key[1])
    except (ConfigError, DataError) as e:
        print(f"jobs.scala_compare: error: {e}", file=sys.stderr)
        return 2

    for c in cfgs.values():  # fresh run directories (a stale one would mix two runs' metrics)
        shutil.rmtree(Path(c["output"]["root"]) / c["output"]["name"], ignore_errors=True)
    print(f"jobs.scala_compare: {len(jobs)} runs ({', '.join(args.methods)} × {', '.join(args.partitions)}) on "
          f"{args.source}, {cfgs[jobs[0]]['train']['rounds']} rounds each -> {out}", flush=True)
    t0 = time.perf_counter()
    results: dict = {}

    def done(key):
        r = results[key]
        print(f"  {key[0]:<12} {key[1]:<8} acc {r['accuracy']:.4f} ({r['seconds']:.0f} s)", flush=True)

    par = (args.parallel or min(2, os.cpu_count() or 1)) if args.backend == "local" else 1
    if par > 1:
        with ProcessPoolExecutor(max_workers=par, mp_context=get_context("spawn")) as pool:
            futs = {key: pool.submit(_run_one, cfgs[key]) for key in jobs}
            for key in jobs:
                results[key] = futs[key].result()
                done(key)
    else:
        for key in jobs:
            results[key] = _run_one(cfgs[key])
            done(key)
    elapsed = time.perf_counter() - t0

    from fedray.reporting.report import report

    run_dirs = {key: Path(r["run_dir"]) for key, r in results.items()}
    report([run_dirs[k] for k in jobs], out / "report")
    for p in args.partitions:
        report([run_dirs[(m, p)] for m in args.methods], out / "report" / p)
    table = comparison_table(run_dirs, args.methods, args.partitions)
    c0 = cfgs[jobs[0]]
    model = c0["model"]["params"] or "paper widths"
    text = "\n".join([
        "# SCALA comparison (jobs.scala_compare)",
        "",
        f"{args.source} / alexnet_split ({model}), split after 6 layers; 100 clients, 10 per round; partitions: "
        + "; ".join(f"{p} = {PARTITIONS[p][2]}" for p in args.partitions)
        + f". {c0['train']['rounds']} rounds, SGD lr {args.lr}. Split methods: B = 320 in proportion to client data, "
        f"{local_iters(args)} local iterations per round; FL baselines: "
        f"{fl_steps(args)} local iterations (train.local_steps) of batch 32. Seed {args.seed}. "
        f"Wall time {elapsed / 60:.1f} min.",
        "",
        "Accuracy of the global model on the full test set at the last round (raw, EMA-0.9, best over rounds);",
        "communication per round (first partition) in MB: client-side/whole-model weights down + up, and for",
        "split methods the activations (+ labels) up and gradients down.",
        "",
        table,
        "",
        "Plots: `report/accuracy.png`, `report/loss.png` (all runs); per partition in `report/<partition>/`.",
        "",
    ])
    (out / "scala_compare.md").write_text(text)
    print(table)
    print(f"jobs.scala_compare: wrote {out / 'scala_compare.md'} and {out / 'report'} ({elapsed / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
