"""Reproduce FedRCL's headline comparison at CPU scale: FedAvg vs FedSCL vs FedRCL under label skew.

    python -m jobs.fedrcl_compare                       # mnist5k, cnn_taps, alpha 0.05 and 0.3 (~20 min, 2 cores)
    python -m jobs.fedrcl_compare --quick               # smoke run (~1 min): 3 rounds, 1 local epoch
    python -m jobs.fedrcl_compare --source cifar10 --data-root /data --backend ray   # GN ResNet-18 by default

Setting (FedRCL §5.1 scaled down): 100 clients with equal-sized balanced-Dirichlet shards
(α ∈ {0.05, 0.3}), 5 clients per round, SGD lr 0.1 decayed ×0.998 per round, weight decay 1e-3, no
momentum, gradient-norm clip 10, 5 local epochs, unweighted mean aggregation; λ = 0.7, β = 1, τ = 0.05.
On mnist5k (40 images per client) the batch is 10 (4 iterations per epoch); on CIFAR it is 50 (10
iterations per epoch with 500 images per client, the paper's setting) with the paper's augmentation
(rotation 10°, crop with padding 4, horizontal flip). The global model is evaluated every round (raw and
EMA-0.9 accuracy) and the feature-analysis metrics (within/between-class covariance traces, effective
rank, VCI) are logged every ``--analysis-every`` rounds.

Sizing: on mnist5k / cnn_taps one local step costs ~30 ms (CE) to ~35 ms (FedRCL) of one core and an
evaluation ~1.5 s, so a round (5 clients × 20 steps) takes ~5 s and a run of the default 80 rounds
~7 min; two runs at a time on 2 cores finish the 6 runs in ~20 min.

Outputs under ``--out`` (default ``runs/fedrcl_compare``): one run directory per (method, α) in ``runs/``,
``fedrcl_compare.md`` (settings + a method × α table: final / EMA / best accuracy and the last feature
metrics), and ``fedray report`` outputs (``summary.md``, ``summary.csv``, ``accuracy.png``, ``loss.png``,
``analysis.png``) for all runs in ``report/`` and per α in ``report/alpha-<α>/``.

With ``--backend local`` (default) runs execute as ``--parallel`` separate processes (one per core by
default), each with the in-process engine and one torch thread; ``--backend ray`` runs them one after
the other on Ray with ``--workers`` client workers (a cluster: connect with ``RAY_ADDRESS``).
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

METHODS = ("fedavg", "fedscl", "fedrcl")
# baselines that may be added with --methods (their METHODS.md defaults)
EXTRA_METHODS = ("fedprox", "moon", "fedlc", "fedntd", "feddecorr", "fedmlb", "fedproc", "feddyn", "fitnet", "fedcl")
ALPHAS = (0.05, 0.3)
CIFAR_LIKE = ("cifar10", "cifar100", "tiny-imagenet", "cinic10")


def experiment_config(method: str, alpha: float, args) -> dict:
    """The config dict of one run of the comparison."""
    quick = bool(args.quick)
    cifar = args.source in CIFAR_LIKE
    rounds = args.rounds if args.rounds is not None else (3 if quick else 80)
    params = {"weighting": "uniform"} if method in METHODS else {}  # FedRCL: unweighted mean (equal-sized clients)
    if method == "fedrcl":
        params.update(lam=0.7, beta=1.0, tau=0.05)
    elif method == "fedscl":
        params.update(tau=0.05)
    return {
        "seed": int(args.seed),
        "data": {
            "source": args.source,
            "root": args.data_root,
            "normalize": True,
            "cache_dir": str(Path(args.out) / "_partitions"),
            "partition": {"name": "balanced_dirichlet", "num_clients": 100, "params": {"alpha": float(alpha)}},
        },
        "model": {"name": args.model or ("resnet18_gn" if cifar else "cnn_taps")},
        "algorithm": {"name": method, "params": params},
        "server": {"name": "none"},
        "train": {
            "rounds": int(rounds),
            "clients_per_round": 5,
            "local_epochs": 1 if quick else 5,
            "batch_size": 50 if cifar else 10,
            "optimizer": "sgd",
            "lr": 0.1,
            "momentum": 0.0,
            "weight_decay": 1e-3,
            "lr_decay": 0.998,
            "grad_clip": 10.0,
            "augment": ["rotate", "crop", "flip"] if cifar else None,
        },
        "eval": {"every": 1, "ema": 0.9, "analysis_every": int(args.analysis_every or (1 if quick else 5))},
        "engine": {
            "backend": args.backend,
            "num_workers": args.workers,
            "torch_threads": int(args.threads),
            "device": args.device,
        },
        "output": {
            "root": str(Path(args.out) / "runs"),
            "name": f"{method}-a{alpha:g}",
            "checkpoint_every": 10,
            "tensorboard": False,
            "progress": False,
        },
    }


def _run_one(cfg_dict: dict) -> dict:
    """Run one experiment (in this process) and return a short summary."""
    from fedray.config import from_dict
    from fedray.engine.runner import run_experiment

    t0 = time.perf_counter()
    res = run_experiment(from_dict(cfg_dict), progress=False, log=lambda *a: None, overwrite=True)
    return {"run_dir": str(res.run_dir), "accuracy": res.accuracy, "seconds": time.perf_counter() - t0,
            "weights_hash": res.weights_hash}


def _last(rows: list[dict], key: str):
    for r in reversed(rows):
        v = r.get(key)
        if v is not None:
            return v
    return None


def comparison_table(run_dirs: dict[tuple[str, float], Path], methods, alphas) -> str:
    """Markdown: one row per method, per α the final / EMA-0.9 / best accuracy, effective rank and VCI."""
    from fedray.reporting.rundir import RunDir

    head = ["method"]
    for a in alphas:
        head += [f"acc α={a:g}", f"EMA α={a:g}", f"best α={a:g}", f"eff.rank α={a:g}", f"VCI α={a:g}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def fmt(v, digits=4):
        return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"

    for m in methods:
        cells = [m]
        for a in alphas:
            rows = RunDir(run_dirs[(m, a)]).read_metrics()
            acc = [r["accuracy"] for r in rows if r.get("accuracy") is not None]
            ana = _last(rows, "analysis") or {}
            cells += [fmt(acc[-1] if acc else None), fmt(_last(rows, "ema_accuracy")), fmt(max(acc) if acc else None),
                      fmt(ana.get("effective_rank"), 2), fmt(ana.get("vci"), 3)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def early_table(run_dirs: dict[tuple[str, float], Path], methods, alphas) -> str:
    """Markdown for the paper's early-training claims: per α the mean accuracy over the first quarter of the
    rounds and the effective rank / VCI at the first analysis round."""
    from fedray.reporting.rundir import RunDir

    head = ["method"]
    rounds_q, first_ana = None, None
    for a in alphas:
        head += [f"mean acc, first quarter α={a:g}", f"eff.rank first α={a:g}", f"VCI first α={a:g}"]
    lines = []
    for m in methods:
        cells = [m]
        for a in alphas:
            rows = RunDir(run_dirs[(m, a)]).read_metrics()
            q = max(1, len(rows) // 4)
            early = [r["accuracy"] for r in rows[:q] if r.get("accuracy") is not None]
            ana = next((r for r in rows if r.get("analysis")), None)
            rounds_q, first_ana = q, (ana["round"] if ana else None)
            cells += [f"{sum(early) / len(early):.4f}" if early else "–",
                      f"{ana['analysis']['effective_rank']:.2f}" if ana else "–",
                      f"{ana['analysis']['vci']:.3f}" if ana else "–"]
        lines.append("| " + " | ".join(cells) + " |")
    note = f"Rounds 1..{rounds_q}; feature metrics at round {first_ana}." if rounds_q else ""
    return "\n".join([note, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head), *lines])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.fedrcl_compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=None, help="rounds per run (default 80, --quick 3)")
    ap.add_argument("--out", default="runs/fedrcl_compare", help="output directory")
    ap.add_argument("--quick", action="store_true", help="smoke mode: 3 rounds, 1 local epoch (~1 min)")
    ap.add_argument("--source", default="mnist5k", help="data source (e.g. cifar10 with --data-root)")
    ap.add_argument("--model", default=None,
                    help="model name (default cnn_taps; resnet18_gn for cifar10/cifar100/tiny-imagenet/cinic10)")
    ap.add_argument("--data-root", default=None, help="directory of on-disk datasets (data.root)")
    ap.add_argument("--alphas", type=float, nargs="+", default=list(ALPHAS), help="Dirichlet α values")
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=[*METHODS, *EXTRA_METHODS],
                    help=f"default {' '.join(METHODS)}; baselines that can be added: {' '.join(EXTRA_METHODS)}")
    ap.add_argument("--analysis-every", type=int, default=None, help="feature metrics every k rounds (default 5, --quick 1)")
    ap.add_argument("--backend", choices=["local", "ray"], default="local")
    ap.add_argument("--parallel", type=int, default=None,
                    help="local backend: runs at once, in separate processes (default: CPU cores, at most 2)")
    ap.add_argument("--workers", type=int, default=None, help="ray backend: client workers per run")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per client worker")
    ap.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)

    from fedray.config import ConfigError, from_dict
    from fedray.data.table import DataError

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.rounds is not None and args.rounds < 1:
        print("jobs.fedrcl_compare: error: --rounds: must be >= 1", file=sys.stderr)
        return 2
    if args.backend == "local":
        args.workers = 1
    jobs = [(m, a) for a in args.alphas for m in args.methods]
    cfgs = {key: experiment_config(*key, args) for key in jobs}
    try:
        # validate every config and build each partition once, before any training starts
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
        print(f"jobs.fedrcl_compare: error: {e}", file=sys.stderr)
        return 2

    for c in cfgs.values():  # fresh run directories (a stale one would mix two runs' metrics and client state)
        shutil.rmtree(Path(c["output"]["root"]) / c["output"]["name"], ignore_errors=True)
    print(f"jobs.fedrcl_compare: {len(jobs)} runs ({', '.join(args.methods)} × α {args.alphas}) on {args.source} / "
          f"{cfgs[jobs[0]]['model']['name']}, {cfgs[jobs[0]]['train']['rounds']} rounds each -> {out}", flush=True)
    t0 = time.perf_counter()
    results: dict[tuple[str, float], dict] = {}
    if args.backend == "local":
        par = args.parallel or min(2, os.cpu_count() or 1)
        if par > 1:
            with ProcessPoolExecutor(max_workers=par, mp_context=get_context("spawn")) as pool:
                futs = {key: pool.submit(_run_one, cfgs[key]) for key in jobs}
                for key in jobs:
                    results[key] = futs[key].result()
                    print(f"  {key[0]:<7} α={key[1]:<5g} acc {results[key]['accuracy']:.4f} "
                          f"({results[key]['seconds']:.0f} s)", flush=True)
        else:
            for key in jobs:
                results[key] = _run_one(cfgs[key])
                print(f"  {key[0]:<7} α={key[1]:<5g} acc {results[key]['accuracy']:.4f} "
                      f"({results[key]['seconds']:.0f} s)", flush=True)
    else:
        for key in jobs:
            results[key] = _run_one(cfgs[key])
            print(f"  {key[0]:<7} α={key[1]:<5g} acc {results[key]['accuracy']:.4f} ({results[key]['seconds']:.0f} s)",
                  flush=True)
    elapsed = time.perf_counter() - t0

    from fedray.reporting.report import report

    run_dirs = {key: Path(r["run_dir"]) for key, r in results.items()}
    report([run_dirs[k] for k in jobs], out / "report")
    for a in args.alphas:
        report([run_dirs[(m, a)] for m in args.methods], out / "report" / f"alpha-{a:g}")
    table = comparison_table(run_dirs, args.methods, args.alphas)
    tr = cfgs[jobs[0]]["train"]
    text = "\n".join([
        "# FedRCL comparison (jobs.fedrcl_compare)",
        "",
        f"{args.source} / {cfgs[jobs[0]]['model']['name']}; 100 clients, balanced Dirichlet α ∈ {{{', '.join(f'{a:g}' for a in args.alphas)}}}, "
        f"{tr['clients_per_round']} clients per round, {tr['rounds']} rounds, {tr['local_epochs']} local epochs, "
        f"batch {tr['batch_size']}, SGD lr {tr['lr']} ×{tr['lr_decay']}/round, weight decay {tr['weight_decay']}, "
        f"clip {tr['grad_clip']}, augment {tr['augment']}; FedRCL λ 0.7, β 1, τ 0.05; seed {args.seed}. "
        f"Wall time {elapsed / 60:.1f} min.",
        "",
        "Accuracy of the global model on the full test set at the last round (raw, EMA-0.9, best over rounds) and the",
        "feature metrics of its test embeddings at the last analysis round (effective rank of the covariance, VCI).",
        "",
        table,
        "",
        "Early training (the paper's claims: FedRCL above FedSCL early on; FedSCL's effective rank below FedAvg's,",
        "FedRCL's above):",
        "",
        early_table(run_dirs, args.methods, args.alphas),
        "",
        "Plots: `report/accuracy.png`, `report/analysis.png` (all runs); per α in `report/alpha-<α>/`.",
        "",
    ])
    (out / "fedrcl_compare.md").write_text(text)
    print(table)
    print(f"jobs.fedrcl_compare: wrote {out / 'fedrcl_compare.md'} and {out / 'report'} ({elapsed / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
