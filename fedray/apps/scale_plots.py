"""PNG plots of a scaling table (:func:`fedray.apps.scale.run_scale` writes them into ``plots/``):
throughput vs clients per round, latency split vs population, memory vs population and vs clients per
round, speed-up vs workers. A plot is skipped when its axis has a single value."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

#: the swept axes of a scale sweep (fedray.apps.scale), in table order
AXES = ("population", "clients_per_round", "num_workers", "multi_client", "fold_group")


def _groups(rows: list[dict], axis: str) -> dict[tuple, list[dict]]:
    """Ok rows grouped by the values of the other axes, each group sorted by ``axis``."""
    out: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("status") != "ok":
            continue
        key = tuple((a, r[a]) for a in AXES if a != axis)
        out.setdefault(key, []).append(r)
    return {k: sorted(v, key=lambda r: r[axis]) for k, v in out.items() if len(v) > 1}


def _label(key: tuple) -> str:
    short = {"population": "P", "clients_per_round": "K", "num_workers": "W", "multi_client": "m", "fold_group": "g"}
    return " ".join(f"{short[a]}={v}" for a, v in key)


def write_plots(rows: list[dict], out: Path) -> list[Path]:
    """PNG plots of the table (see the module docstring); returns the files written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    files = []

    def save(fig, name):
        p = out / name
        fig.tight_layout()
        fig.savefig(p, dpi=110)
        plt.close(fig)
        files.append(p)

    g = _groups(rows, "clients_per_round")
    if g:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for key, rs in g.items():
            ax.plot([r["clients_per_round"] for r in rs], [r["client_updates_per_s"] for r in rs], "o-", label=_label(key))
        ax.set(xscale="log", xlabel="clients per round", ylabel="client updates / s", title="Throughput vs clients per round")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        save(fig, "throughput_vs_clients_per_round.png")
    g = _groups(rows, "population")
    if g:
        n = len(g)
        fig, axes = plt.subplots(1, n, figsize=(min(4.2 * n, 16), 4.2), squeeze=False)
        parts = ["sample_s", "broadcast_s", "train_s", "aggregate_s", "eval_s", "overhead_s"]
        for ax, (key, rs) in zip(axes[0], g.items()):
            xs = np.arange(len(rs))
            bottom = np.zeros(len(rs))
            for p in parts:
                vals = np.array([max(0.0, r.get(p) or 0.0) if not math.isnan(r.get(p) or 0.0) else 0.0 for r in rs])
                ax.bar(xs, vals, bottom=bottom, label=p[:-2])
                bottom += vals
            ax.set_xticks(xs, [f"{r['population']:,}" for r in rs], rotation=30)
            ax.set(xlabel="population (clients)", ylabel="seconds per round", title=_label(key))
            ax.grid(True, axis="y", alpha=0.3)
        axes[0][0].legend(fontsize=7)
        fig.suptitle("Round latency split vs population")
        save(fig, "latency_vs_population.png")
    for axis, fname, xlabel in (("population", "memory_vs_population.png", "population (clients)"),
                                ("clients_per_round", "memory_vs_clients_per_round.png", "clients per round")):
        g = _groups(rows, axis)
        if not g:
            continue
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for i, (key, rs) in enumerate(g.items()):
            xs = [r[axis] for r in rs]
            c = f"C{i % 10}"
            ax.plot(xs, [r["coordinator_peak_mb"] for r in rs], "o-", color=c, label=f"coordinator peak {_label(key)}")
            ax.plot(xs, [r["workers_peak_mb"] for r in rs], "s--", color=c, label=f"worker peak {_label(key)}")
            if any(not math.isnan(r.get("object_store_used_mb", math.nan)) for r in rs):
                ax.plot(xs, [r["object_store_used_mb"] for r in rs], "^:", color=c, label=f"object store {_label(key)}")
        ax.set(xscale="log", xlabel=xlabel, ylabel="MB", title=f"Memory vs {xlabel.split(' (')[0]}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=6)
        save(fig, fname)
    g = _groups(rows, "num_workers")
    if g:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        wmax = 1
        for key, rs in g.items():
            ws = [r["num_workers"] for r in rs]
            wmax = max(wmax, max(ws))
            ax.plot(ws, [r["speedup_vs_fewest_workers"] for r in rs], "o-", label=_label(key))
        w0 = min(r["num_workers"] for rs in g.values() for r in rs)
        ax.plot([w0, wmax], [1.0, wmax / w0], "k:", label="ideal")
        ax.set(xlabel="client workers", ylabel="speed-up (client updates / s)", title="Speed-up vs workers")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
        save(fig, "speedup_vs_workers.png")
    return files
