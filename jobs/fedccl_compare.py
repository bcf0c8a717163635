"""Reproduce the FedCCL comparison (paper Tables 1-2 and 4, optionally Table 8) at CPU scale.

    python -m jobs.fedccl_compare                 # full: FedAvg, FedProto, FPL, FedCCL (+ its two one-signal
                                                  # ablations) on three settings
    python -m jobs.fedccl_compare --quick         # smoke test, about 1-2 minutes
    python -m jobs.fedccl_compare --robustness    # also FedAvg / FedAvg+ / FedCCL+ clean, FGSM, PGD-20
    python -m jobs.fedccl_compare --out DIR --seeds 3 --methods fedavg fedccl --settings mnist-dir0.05

Settings (configs in ``jobs/configs``):

* ``digits-balanced`` / ``digits-imbalanced``: source ``digits-domains``, one client per domain
  (``domain`` partitioner; equal sizes, or Dirichlet-0.5 sizes), backbone CNN + 2-layer MLP head trained
  from scratch (no pre-trained weights are available offline), Adam 1e-3, batch 64, 1 local epoch,
  60 rounds (``fedccl_digits.yaml``);
* ``mnist-dir0.05``: source ``mnist5k``, 10 clients, Dirichlet 0.05 with unequal sizes, 4-layer CNN,
  SGD 0.01, batch 64, 1 local epoch, 100 rounds (``fedccl_mnist.yaml``);
* ``--robustness``: ``fedccl_plus_mnist.yaml`` (Table 8) with FedAvg, FedAvg+ and FedCCL+;
* ``digit5`` / ``office10`` / ``domainnet`` (only when named in ``--settings``, with ``--data-root DIR``
  holding the datasets' image folders, see ``fedray datasets``): the inter-domain setting on the real data,
  one client per domain. ``--backbone-weights FILE`` loads a pre-trained backbone state_dict from a local
  file and freezes it (the paper's frozen extractor; the contrast then acts on the MLP head's hidden layer).

Every method runs on the same partition and initial model. Accuracy is the mean of the last five
evaluated rounds (per domain and their average where the test split has domains), averaged over seeds
(± standard deviation when there are several). Writes ``OUT/summary.md`` (all tables),
``OUT/results.json`` and, per setting, ``OUT/<setting>/`` with the curves and tables of
:func:`fedray.reporting.report.report`. ``--quick`` uses 2 rounds, narrow models, 300 images per
digits domain and a 200-sample PGD-5 evaluation: it checks the pipeline, not the numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

CONFIGS = Path(__file__).resolve().parent / "configs"
METHODS = ("fedavg", "fedproto", "fpl", "fedccl", "fedccl-local", "fedccl-global")
# FedCCL's ablations (Table 5): one contrast term only; a method name here maps to (algorithm, params).
VARIANTS = {"fedccl-local": ("fedccl", {"signals": "local"}), "fedccl-global": ("fedccl", {"signals": "global"})}
ROBUST_METHODS = ("fedavg", "fedavg_plus", "fedccl_plus")
SETTINGS = {
    "digits-balanced": ("fedccl_digits.yaml", []),
    "digits-imbalanced": ("fedccl_digits.yaml", ["data.partition.params.balance=imbalanced",
                                                 "data.partition.params.alpha=0.5"]),
    "mnist-dir0.05": ("fedccl_mnist.yaml", []),
}
# The paper's inter-domain datasets, read from their image folders under --data-root when present (never
# downloaded): the digits-domains setting with the real source, one client per domain.
ON_DISK = {
    "digit5": ("fedccl_digits.yaml", ["data.source=digit5", "data.partition.num_clients=5",
                                      "train.clients_per_round=5"]),
    "office10": ("fedccl_digits.yaml", ["data.source=office10", "data.partition.num_clients=4",
                                        "train.clients_per_round=4"]),
    "domainnet": ("fedccl_digits.yaml", ["data.source=domainnet", "data.partition.num_clients=6",
                                         "train.clients_per_round=6"]),
}
EMBEDDED = tuple(SETTINGS)
SETTINGS.update(ON_DISK)
BACKBONE_SETTINGS = {name for name, (f, _) in SETTINGS.items() if f == "fedccl_digits.yaml"}  # cnn_backbone_mlp
ROBUST_SETTING = ("robustness-mnist", "fedccl_plus_mnist.yaml")
QUICK = {"rounds": 3, "max_per_domain": 500}


def method_params(method: str, base: dict) -> dict:
    """The config's algorithm params that ``method`` accepts (FedCCL params for fedccl*, ``adv*`` for *_plus)."""
    from fedray.algorithms import ALGORITHMS, build_algorithm

    build_algorithm(method, {})  # imports the registry, checks the name
    known = ALGORITHMS[method].params_spec
    return {k: v for k, v in base.items() if k in known}


def build_config(setting_file: str, overrides: list[str], method: str, seed: int, out: Path, *, quick: bool,
                 backend: str, workers: int | None, rounds: int | None = None):
    from fedray.config import load_config

    cfg = load_config(CONFIGS / setting_file, overrides)
    base_params = dict(cfg.algorithm.params)
    algo, extra = VARIANTS.get(method, (method, {}))
    cfg.algorithm.name = algo
    cfg.algorithm.params = {**method_params(algo, base_params), **extra}
    cfg.seed = seed
    cfg.data.partition.seed = 0  # the same partition for every seed and method
    cfg.output.root = str(out / "runs")
    cfg.output.tensorboard = False
    cfg.output.progress = False
    cfg.output.checkpoint_every = 0
    cfg.engine.backend = backend
    cfg.engine.num_workers = workers
    cfg.data.cache_dir = str(out / "runs" / "_partitions")
    if rounds is not None:
        cfg.train.rounds = rounds
    if quick:
        cfg.train.rounds = QUICK["rounds"]
        if cfg.model.name == "cnn4":
            cfg.model.params = {**cfg.model.params, "channels": [8, 16], "embed_dim": 32}
        elif cfg.model.name == "cnn_backbone_mlp":
            cfg.model.params = {**cfg.model.params, "hidden": 32,
                                "backbone_options": {"channels": [4, 8], "hidden": 32, "embed_dim": 32}}
        if cfg.algorithm.name.endswith("_plus"):
            cfg.algorithm.params = {**cfg.algorithm.params, "adv_steps": 2}
        if cfg.eval.adversarial:
            cfg.eval.adversarial = {**cfg.eval.adversarial, "pgd_steps": 5, "max_samples": 200, "every": 0}
    from fedray.config import validate_config

    validate_config(cfg)
    return cfg


def last5(rows: list[dict]) -> dict:
    """Mean of the last five evaluated rounds: accuracy, per-domain accuracy and their average."""
    ev = [r for r in rows if r.get("accuracy") is not None][-5:]
    out = {"accuracy": sum(r["accuracy"] for r in ev) / len(ev) if ev else math.nan, "rounds": len(rows)}
    doms = [r["domain_accuracy"] for r in ev if r.get("domain_accuracy")]
    if doms:
        names = list(doms[-1])
        out["domains"] = {n: sum(d.get(n, math.nan) for d in doms) / len(doms) for n in names}
        out["domain_mean"] = sum(out["domains"].values()) / len(names)
    rob = [r["robustness"] for r in rows if r.get("robustness")]
    if rob:
        out["robustness"] = rob[-1]
    sig = [r.get("bytes_signals", 0) for r in rows]
    out["signal_mb_per_round"] = sum(sig) / len(sig) / 1e6 if sig else 0.0
    out["weight_mb_per_round"] = (sum(r["bytes"]["broadcast"] + r["bytes"]["upload"] for r in rows) / len(rows) / 1e6
                                  if rows else 0.0)
    return out


def _mean_std(values: list[float]) -> str:
    vals = [v for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return "n/a"
    m = sum(vals) / len(vals)
    if len(vals) == 1:
        return f"{100 * m:.2f}"
    sd = math.sqrt(sum((v - m) ** 2 for v in vals) / (len(vals) - 1))
    return f"{100 * m:.2f} ± {100 * sd:.2f}"


def accuracy_table(setting: str, results: dict) -> str:
    """Markdown table: one row per method, per-domain columns (where present), average, accuracy, traffic."""
    methods = list(results)
    first = results[methods[0]][0]
    domains = list(first.get("domains", {}))
    cols = ["method", *domains, "avg (domains)" if domains else None, "accuracy", "signal MB/round",
            "weights MB/round"]
    cols = [c for c in cols if c is not None]
    lines = [f"### {setting} (mean of the last five rounds, %)", "", "| " + " | ".join(cols) + " |",
             "|" + "---|" * len(cols)]
    for m in methods:
        runs = results[m]
        cells = [m]
        cells += [_mean_std([r["domains"].get(d, math.nan) for r in runs]) for d in domains]
        if domains:
            cells.append(_mean_std([r["domain_mean"] for r in runs]))
        cells.append(_mean_std([r["accuracy"] for r in runs]))
        cells.append(f"{sum(r['signal_mb_per_round'] for r in runs) / len(runs):.3f}")
        cells.append(f"{sum(r['weight_mb_per_round'] for r in runs) / len(runs):.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def robustness_table(results: dict) -> str:
    lines = ["### robustness (last round, %)", "", "| method | eps | clean | FGSM | PGD |", "|---|---|---|---|---|"]
    for m, runs in results.items():
        rob = [r["robustness"] for r in runs if r.get("robustness")]
        if not rob:
            continue
        lines.append(f"| {m} | {rob[0]['eps']} | {_mean_std([x['clean_accuracy'] for x in rob])} | "
                     f"{_mean_std([x['fgsm_accuracy'] for x in rob])} | "
                     f"{_mean_std([x['pgd_accuracy'] for x in rob])} (PGD-{rob[0]['pgd_steps']}) |")
    return "\n".join(lines)


def run_setting(name: str, setting_file: str, overrides: list[str], methods, seeds: int, out: Path, args, log):
    from fedray.engine.runner import run_experiment
    from fedray.reporting.report import report

    results: dict[str, list[dict]] = {}
    dirs = []
    for method in methods:
        for seed in range(seeds):
            cfg = build_config(setting_file, overrides, method, seed, out, quick=args.quick, backend=args.backend,
                               workers=args.workers, rounds=args.rounds)
            if args.quick:
                cfg.data.params = {**cfg.data.params, **_source_subset(cfg.data.source)}
            t0 = time.perf_counter()
            res = run_experiment(cfg, progress=False, log=lambda *a: None, overwrite=True)
            summary = last5(res.rounds)
            results.setdefault(method, []).append(summary)
            dirs.append(res.run_dir)
            log(f"[fedccl_compare] {name:18s} {method:12s} seed {seed}: acc {summary['accuracy']:.4f}"
                + (f" | domains {summary['domain_mean']:.4f}" if "domain_mean" in summary else "")
                + f" | {time.perf_counter() - t0:.1f} s | {res.run_dir}")
    report([str(d) for d in dirs], out=out / name)
    return results


def _source_subset(source: str) -> dict:
    """--quick: the source parameter that shrinks the data, when the source has one."""
    from fedray.data.sources import SOURCES

    spec = SOURCES[source]
    params = getattr(spec, "params", None) or {}
    return {"max_per_domain": QUICK["max_per_domain"]} if "max_per_domain" in params else {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m jobs.fedccl_compare", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="2 rounds, narrow models: a 1-2 minute smoke test")
    ap.add_argument("--out", default="runs/fedccl_compare", help="output directory (default runs/fedccl_compare)")
    ap.add_argument("--rounds", type=int, default=None, help="override train.rounds of every setting")
    ap.add_argument("--seeds", type=int, default=1, help="seeds per method (the paper uses 3)")
    ap.add_argument("--methods", nargs="+", default=list(METHODS),
                    help=f"methods (default {' '.join(METHODS)}; fedccl-local / fedccl-global are FedCCL with "
                         "only the local / only the global signal contrast)")
    ap.add_argument("--settings", nargs="+", default=list(EMBEDDED), choices=list(SETTINGS),
                    help=f"settings to run (default the embedded ones: {' '.join(EMBEDDED)}; "
                         f"{' / '.join(ON_DISK)} need --data-root)")
    ap.add_argument("--data-root", default=None, help="directory holding the on-disk datasets (data.root)")
    ap.add_argument("--backbone-weights", default=None,
                    help="local .pt state_dict of a pre-trained backbone for the cnn_backbone_mlp settings; "
                         "the backbone is frozen")
    ap.add_argument("--robustness", action="store_true", help="also run Table 8 (FedAvg, FedAvg+, FedCCL+)")
    ap.add_argument("--backend", default="local", choices=["local", "ray"], help="engine backend (default local)")
    ap.add_argument("--workers", type=int, default=None, help="client workers (default: engine default)")
    args = ap.parse_args(argv)

    from fedray.config import ConfigError
    from fedray.data.table import DataError

    if args.seeds < 1:
        ap.error("--seeds must be >= 1")
    if args.rounds is not None and args.rounds < 1:
        ap.error("--rounds must be >= 1")
    needs_root = [s for s in args.settings if s in ON_DISK]
    if needs_root and not args.data_root:
        ap.error(f"--settings {' '.join(needs_root)}: give --data-root, the directory holding the dataset's folders")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tables, everything = [], {}
    t0 = time.perf_counter()
    try:
        for name in args.settings:
            setting_file, overrides = SETTINGS[name]
            overrides = list(overrides)
            if args.data_root:
                overrides.append(f"data.root={args.data_root}")
            if args.backbone_weights and name in BACKBONE_SETTINGS:
                overrides += [f"model.params.backbone_weights={args.backbone_weights}",
                              "model.params.freeze_backbone=true"]
            res = run_setting(name, setting_file, overrides, args.methods, args.seeds, out, args, print)
            everything[name] = res
            tables.append(accuracy_table(name, res))
        if args.robustness:
            name, setting_file = ROBUST_SETTING
            res = run_setting(name, setting_file, [], ROBUST_METHODS, args.seeds, out, args, print)
            everything[name] = res
            tables.append(accuracy_table(name, res))
            tables.append(robustness_table(res))
    except (ConfigError, DataError) as e:
        print(f"jobs.fedccl_compare: error: {e}", file=sys.stderr)
        return 2
    header = (f"# FedCCL comparison{' (--quick: pipeline check only)' if args.quick else ''}\n\n"
              f"seeds: {args.seeds}, backend: {args.backend}, total {time.perf_counter() - t0:.0f} s\n")
    text = header + "\n" + "\n\n".join(tables) + "\n"
    (out / "summary.md").write_text(text)
    (out / "results.json").write_text(json.dumps(everything, indent=1, default=float))
    print(text)
    print(f"tables: {out / 'summary.md'}; curves and per-run tables under {out}/<setting>/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
