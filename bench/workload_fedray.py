"""fedray on the benchmark workloads of shared/bench/WORKLOAD.md (W1 / W2) and pfl-shape (bench/workload_def.py),
one JSON line of figures.

    python bench/workload_fedray.py --workload W1 [--backend ray|local] [--workers 2] [--warm] [--fold-group G]

Same data, partition, model, local training, sampling and FedAvg as the floor (bench/workload_floor.py);
evaluation only after the last round; 2 client workers with 1 CPU and 1 torch thread each. The process
ends as ``fedray run`` does (:func:`fedray.core.process_exit.leave`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

T0 = time.perf_counter()

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import workload_def as wd  # noqa: E402  (numpy only at import)

WORKLOADS = wd.WORKLOADS


def config(workload: str, backend: str, workers: int, out: str, chunk: int | None = None, multi_client: int = 1) -> dict:
    w = WORKLOADS[workload]
    n, k, r = w.num_clients, w.per_round, w.rounds
    if w.data == "synthetic":  # pfl-shape: fedray's synthetic source, one client per generating client
        data = {"source": "synthetic", "normalize": False, "params": dict(wd.PFL_SHAPE_SOURCE),
                "partition": {"name": "natural", "num_clients": n}}
        model = {"name": "mlp", "params": {"hidden": [wd.PFL_SHAPE_HIDDEN]}}
    else:
        data = {"source": "mnist5k", "normalize": False,
                "partition": {"name": "dirichlet", "num_clients": n, "params": {"alpha": 0.3}}}
        model = {"name": "fedavg_cnn"}
    return {
        "seed": wd.SEED,
        "data": data,
        "model": model,
        "algorithm": {"name": "fedavg"},
        "train": {"rounds": r, "clients_per_round": k, "batch_size": wd.BATCH_SIZE, "lr": wd.LR,
                  "local_epochs": wd.LOCAL_EPOCHS},
        "eval": {"every": r},
        "engine": {"backend": backend, "num_workers": workers, "worker_num_cpus": 1, "torch_threads": 1,
                   "chunk_size": chunk, "multi_client": multi_client},
        "output": {"root": out, "checkpoint_every": 0, "tensorboard": False, "progress": False},
    }


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", choices=sorted(WORKLOADS), default="W1")
    ap.add_argument("--backend", choices=["ray", "local"], default="ray")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=None)
    ap.add_argument("--multi-client", type=int, default=1, help="engine.multi_client: clients trained at once per worker")
    ap.add_argument("--out", default=None)
    ap.add_argument("--warm", action="store_true",
                    help="join the Ray of `fedray up` when one runs (as `fedray run` does); default: a cold local Ray")
    ap.add_argument("--fold-group", type=int, default=None, metavar="G", help="engine.fold_group=G")
    args = ap.parse_args(argv)
    import yaml

    from fedray.cli import build_parser, parse_args, run_command

    out = args.out or tempfile.mkdtemp(prefix="fedray-bench-")
    raw = config(args.workload, args.backend, args.workers, out, args.chunk, args.multi_client)
    if args.fold_group is not None:
        raw["engine"]["fold_group"] = args.fold_group
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, f"{args.workload}.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(raw, f)
    log = lambda *a: print(*a, file=sys.stderr)  # noqa: E731
    # the code of `fedray run PATH --overwrite --quiet [--no-warm]`, its parser included; start-up counts from T0
    t_run = time.perf_counter()
    run_args = parse_args(build_parser(), ["run", path, "--overwrite", "--quiet", *([] if args.warm else ["--no-warm"])])
    res = run_command(run_args, t0=T0, log=log)
    rounds = res.rounds
    round_s = [r["wall_seconds"] - (r["seconds"]["eval"] if i == len(rounds) - 1 else 0.0)
               for i, r in enumerate(rounds)]
    print(json.dumps({
        "impl": f"fedray-{args.backend}-{args.workers}w" + (f"-m{args.multi_client}" if args.multi_client > 1 else "")
                + ("-warm" if args.warm else ""),
        "workload": args.workload,
        # imports + data + partition + engine start (coordinator and workers ready), as WORKLOAD.md §8
        "startup_s": res.startup_seconds,
        "startup_phases": {"imports_s": t_run - T0, **{f"{k}_s": v for k, v in res.startup_phases.items()}},
        "rounds_s": float(sum(round_s)), "round_s": round_s, "accuracy": res.accuracy,
        "weights_hash": res.weights_hash, "total_s": time.perf_counter() - T0,
    }))


if __name__ == "__main__":
    main()
    from fedray.core.process_exit import leave

    leave(0)  # the process ends as `fedray run`'s does (fedray.cli.console): without the interpreter's teardown
