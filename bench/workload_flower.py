"""Flower's simulation engine on the benchmark workloads (W1 / W2 of shared/bench/WORKLOAD.md, pfl-shape of
bench/workload_def.py), one JSON line of figures.

    bench/.flower-venv/bin/python bench/workload_flower.py --workload W1
    bench/.flower-venv/bin/python bench/workload_flower.py --workload pfl-shape --data bench/out/pfl-shape.npz

Runs the ServerApp/ClientApp of ``bench/flower_app`` with ``flwr.simulation.run_simulation``: N SuperNodes,
2 Ray actors of 1 CPU each (``client_resources: num_cpus 1``, Ray started with 2 CPUs), 1 torch thread per
client. Needs the separate virtualenv made by ``bench/bench_workload.py --flower`` (Flower pins its own Ray).
Prints the same fields as bench/workload_floor.py and bench/workload_fedray.py.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

T0 = time.perf_counter()
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def main(argv=None):
    from bench import workload_def as wd

    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", type=wd.workload_name, default="W1",
                    help="W1, W2, pfl-shape or a scale point scale-P-K-R (bench/bench_scale_peers.py)")
    ap.add_argument("--data", default="", help="the pfl-shape arrays (.npz) written by bench/bench_workload.py, or a "
                                             "scale point's, written by bench/bench_scale_peers.py")
    ap.add_argument("--actors", type=int, default=2, help="Ray actors running ClientApps (1 CPU each)")
    args = ap.parse_args(argv)
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    import logging

    from flwr.app import Context, RecordDict  # noqa: F401  (import cost belongs to start-up)
    from flwr.simulation import run_simulation

    from bench.flower_app import apps, task

    logging.getLogger("flwr").setLevel(logging.WARNING)  # Flower's per-round INFO lines off (fedray logs nothing)
    data = os.path.abspath(args.data) if args.data else ""
    task.load_data(args.workload, data)  # the driver's own copy (server-side evaluation), as any Flower app would
    n = task.WORKLOADS[args.workload].num_clients
    apps.CONFIG.update(workload=args.workload, data=data)
    backend_config = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                      "init_args": {"num_cpus": args.actors, "num_gpus": 0, "include_dashboard": False,
                                    "log_to_driver": False, "address": "local"}}  # a private Ray instance
    run_simulation(server_app=apps.server_app, client_app=apps.client_app, num_supernodes=n,
                   backend_config=backend_config, verbose_logging=False)
    t = apps.TIMES
    ends = t["round_end"]
    starts = [t["rounds_start"]] + ends[:-1]
    round_s = [b - a for a, b in zip(starts, ends)]
    print(json.dumps({
        "impl": f"flower-{args.actors}a", "workload": args.workload,
        "startup_s": t["rounds_start"] - T0, "rounds_s": ends[-1] - t["rounds_start"], "round_s": round_s,
        "accuracy": apps.RESULT["accuracy"], "weights_hash": apps.RESULT["weights_hash"],
        "total_s": time.perf_counter() - T0,
    }))


if __name__ == "__main__":
    main()
