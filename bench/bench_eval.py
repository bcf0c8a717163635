"""What evaluating every round costs: the demo (jobs/configs/demo.yaml) with ``eval.every: 1`` vs evaluation
only after the last round, on a local Ray; one JSON line per setting and one summary line.

    python bench/bench_eval.py [--rounds 8] [--workers 2] [--reps 1]

"round s" is the mean driver-side wall time (``wall_seconds`` in metrics.jsonl) of rounds 2..R-1 (round 1
is cold, round R always evaluates); "eval s" the mean ``seconds.eval`` of the evaluating rounds among them.
Target (docs/benchmarks.md): round time with evaluation every round <= 1.3x the round time without.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(rounds: int, every: int, workers: int, out: str) -> dict:
    from fedray.config import load_config
    from fedray.driver.runner import run_experiment

    cfg = load_config(ROOT / "jobs" / "configs" / "demo.yaml",
                      [f"train.rounds={rounds}", f"eval.every={every}", f"engine.num_workers={workers}",
                       f"output.root={out}", "output.progress=false"])
    res = run_experiment(cfg, progress=False, log=lambda *a: print(*a, file=sys.stderr), overwrite=True)
    mid = [r for r in res.rounds if 1 < r["round"] < rounds]
    evals = [r["seconds"]["eval"] for r in mid if "accuracy" in r]
    return {"eval_every": every, "workers": workers, "rounds": rounds,
            "round_s": statistics.mean(r["wall_seconds"] for r in mid),
            "eval_s": statistics.mean(evals) if evals else 0.0,
            "accuracy": res.accuracy, "test_loss": res.rounds[-1].get("test_loss"),
            "weights_hash": res.weights_hash}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--reps", type=int, default=1, help="alternating repetitions of both settings")
    args = ap.parse_args(argv)
    from fedray.core.ray_env import ensure_ray

    ensure_ray(None)  # one Ray for every run: start-up is not what is measured
    out = tempfile.mkdtemp(prefix="fedray-bench-eval-")
    res = {1: [], args.rounds: []}
    for _ in range(args.reps):
        for every in (args.rounds, 1):
            r = run(args.rounds, every, args.workers, out)
            print(json.dumps(r))
            res[every].append(r)
    with_eval = statistics.mean(r["round_s"] for r in res[1])
    without = statistics.mean(r["round_s"] for r in res[args.rounds])
    print(json.dumps({"round_s_eval_every_round": with_eval, "round_s_without_eval": without,
                      "ratio": with_eval / without,
                      "eval_s": statistics.mean(r["eval_s"] for r in res[1])}))


if __name__ == "__main__":
    main()
