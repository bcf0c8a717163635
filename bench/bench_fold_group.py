"""Object-store traffic per round with ``engine.fold_group`` (partial sums on the workers): one JSON line per
(workload, g) and a table.

    python bench/bench_fold_group.py [--workloads w2 resnet18] [--groups 1 5 10] [--rounds 3] [--workers 2]

``w2``: the W2 workload of shared/bench/WORKLOAD.md (FedAvg CNN, 1.66 M parameters, 500 clients, 50 per
round; bench/workload_fedray.py's config). ``resnet18``: ``resnet18_gn`` (11.2 M parameters, 44.7 MB per
update) on synthetic CIFAR-shaped data (random 3x32x32 uint8 images, 10 classes, written to a Parquet
file), 100 clients per round, one local step of batch 8 each. Ray, 2 workers of 1 CPU. Per round (means of
rounds 2..R): ``upload_mb`` = vectors the coordinator received from the workers (``bytes.upload``),
``receive_s`` = the coordinator's time fetching task results (``receive_seconds``), ``fold_s`` = the fold and
server step (``seconds.aggregate``), ``round_s`` = the driver's wall time; plus the coordinator's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def resnet_data(root: Path, n_train: int = 800, n_test: int = 100) -> Path:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("test", n_test)):
        x = rng.integers(0, 256, (n, 3 * 32 * 32), dtype=np.uint8)
        y = np.arange(n) % 10
        col = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), 3 * 32 * 32)
        pq.write_table(pa.table({"image": col, "label": pa.array(y, pa.int64())}), root / f"{split}.parquet")
    return root


def config(workload: str, g: int, workers: int, rounds: int, out: str) -> dict:
    if workload == "w2":
        from workload_fedray import config as w_config

        cfg = w_config("W2", "ray", workers, out)
        cfg["train"]["rounds"] = rounds
        cfg["eval"]["every"] = rounds
    else:
        data = resnet_data(Path(out))
        cfg = {
            "seed": 0,
            "data": {"source": "parquet", "root": str(data), "params": {"train_path": "train.parquet",
                                                                        "test_path": "test.parquet",
                                                                        "shape": [3, 32, 32]},
                     "partition": {"name": "iid", "num_clients": 100}},
            "model": {"name": "resnet18_gn"},
            "algorithm": {"name": "fedavg"},
            "train": {"rounds": rounds, "clients_per_round": 100, "batch_size": 8, "local_steps": 1, "lr": 0.01},
            "eval": {"every": rounds},
            "engine": {"backend": "ray", "num_workers": workers, "worker_num_cpus": 1, "torch_threads": 1},
            "output": {"root": out, "checkpoint_every": 0, "tensorboard": False, "progress": False},
        }
    cfg["engine"]["fold_group"] = g
    cfg["output"]["root"] = out
    return cfg


def measure(workload: str, g: int, workers: int, rounds: int) -> dict:
    from fedray.config import from_dict
    from fedray.driver.runner import run_experiment

    out = tempfile.mkdtemp(prefix=f"fedray-bench-fg-{workload}-")
    res = run_experiment(from_dict(config(workload, g, workers, rounds, out)), progress=False,
                         log=lambda *a: print(*a, file=sys.stderr), overwrite=True)
    rows = res.rounds[1:] or res.rounds

    def mean(f):
        return statistics.mean(f(r) for r in rows)

    return {"workload": workload, "fold_group": g, "workers": workers, "rounds": rounds,
            "upload_mb": mean(lambda r: r["bytes"]["upload"]) / 1e6,
            "receive_s": mean(lambda r: r["receive_seconds"]),
            "fold_s": mean(lambda r: r["seconds"]["aggregate"]),
            "round_s": mean(lambda r: r["wall_seconds"] - r["seconds"]["eval"]),
            "coordinator_peak_mb": max(r["memory"]["coordinator_peak_mb"] for r in res.rounds),
            "weights_hash": res.weights_hash}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--workloads", nargs="+", default=["w2", "resnet18"], choices=["w2", "resnet18"])
    ap.add_argument("--groups", nargs="+", type=int, default=[1, 5, 10])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args(argv)
    from fedray.core.ray_env import ensure_ray

    ensure_ray(None)  # one Ray for every run
    results = []
    for w in args.workloads:
        for g in args.groups:
            r = measure(w, g, args.workers, args.rounds)
            print(json.dumps(r), flush=True)
            results.append(r)
    print("| workload | fold_group | upload MB/round | receive s/round | fold s/round | round s | coordinator peak MB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['workload']} | {r['fold_group']} | {r['upload_mb']:.0f} | {r['receive_s']:.3f} | {r['fold_s']:.3f} "
              f"| {r['round_s']:.2f} | {r['coordinator_peak_mb']:.0f} |")


if __name__ == "__main__":
    main()
