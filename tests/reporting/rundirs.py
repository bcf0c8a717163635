"""Run directories written file by file (config.yaml, run.json, metrics.jsonl), as a finished run leaves
them: the reporting tests read them back without training anything."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from fedray.config import dump_config, from_dict


def write_run(root: Path, name: str, accuracies: list[float | None], *, seed: int = 0, algorithm: str = "fedavg",
              alpha: float = 0.3, lr: float = 0.05, extra: dict | None = None) -> Path:
    """A run directory ``root/name`` whose metrics.jsonl has one row per entry of ``accuracies`` (rounds 1..;
    None: a round without evaluation) with an EMA-0.9 accuracy, a loss and seconds like the engine's rows."""
    cfg = {"seed": seed, "algorithm": {"name": algorithm},
           "data": {"partition": {"name": "dirichlet", "num_clients": 20, "params": {"alpha": alpha}}},
           "train": {"rounds": len(accuracies), "lr": lr},
           "output": {"root": str(root), "name": name}}
    for section, values in (extra or {}).items():
        cfg.setdefault(section, {}).update(values)
    path = root / name
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(dump_config(from_dict(cfg)))
    (path / "run.json").write_text(json.dumps({"status": "finished", "algorithm": algorithm, "seed": seed}))
    ema, lines = None, []
    for rnd, acc in enumerate(accuracies, start=1):
        row = {"round": rnd, "loss": 2.0 / rnd, "num_clients": 10, "failures": 0,
               "seconds": {"train": 0.5, "eval": 0.1}, "seconds_total": 0.6}
        if acc is not None:
            ema = acc if ema is None else 0.9 * ema + 0.1 * acc
            row.update({"accuracy": acc, "ema_accuracy": ema, "test_loss": 1.0 - acc})
        lines.append(json.dumps(row, sort_keys=True))
    (path / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    return path


def curve(rng: np.random.Generator, start: float, rounds: int = 6) -> list[float]:
    """A rising accuracy curve with a little noise."""
    return [float(min(0.99, start + 0.08 * r + rng.normal(0, 0.01))) for r in range(rounds)]


def read_metric(path: Path, key: str) -> list[float]:
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    return [r[key] for r in rows if r.get(key) is not None]


def grid(root: Path) -> dict[tuple[str, float], list[Path]]:
    """2 methods x 2 alphas x 3 seeds, plus one fedavg α=0.05 run with another train.lr (its own group)."""
    rng = np.random.default_rng(0)
    runs: dict[tuple[str, float], list[Path]] = {}
    for alg, base in (("fedavg", 0.4), ("fedprox", 0.45)):
        for alpha in (0.05, 0.3):
            runs[(alg, alpha)] = [
                write_run(root, f"{alg}-a{alpha}-s{seed}", curve(rng, base + alpha / 2), seed=seed, algorithm=alg,
                          alpha=alpha, extra={"engine": {"num_workers": seed + 1}})  # workers: not the experiment
                for seed in range(3)]
    runs[("fedavg-lr", 0.05)] = [write_run(root, "fedavg-lr0.01", curve(rng, 0.3), algorithm="fedavg", alpha=0.05,
                                           lr=0.01)]
    return runs
