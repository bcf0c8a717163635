"""Label-distribution statistics of a partition: a summary dict, a text table, and a plot.

All functions accept either a :class:`~fedray.data.store.PartitionStore` or an ``(N, C)`` array of
per-client class counts (as returned by :func:`fedray.data.partition.label_stats`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedray.core.io import atomic_writer

from .table import DataError

__all__ = ["partition_summary", "format_summary", "plot_label_distribution", "class_entropy"]


def _counts_of(store_or_counts: Any) -> tuple[np.ndarray, dict[str, Any]]:
    """``(counts, info)`` from a PartitionStore or an (N, C) counts array."""
    if hasattr(store_or_counts, "class_counts") and hasattr(store_or_counts, "spec"):
        store = store_or_counts
        spec = store.spec
        info = {
            "name": spec.get("name"),
            "hash": store.hash,
            "dataset": store.meta.name,
            "classes": list(store.meta.classes),
            "params": {k: v for k, v in spec.items() if k not in ("name", "num_clients", "seed")},
            "seed": spec.get("seed"),
        }
        return store.class_counts(), info
    counts = np.asarray(store_or_counts)
    if counts.ndim != 2 or (counts.size and not np.issubdtype(counts.dtype, np.integer)) or (counts.size and counts.min() < 0):
        raise DataError(f"expected a PartitionStore or an (N, C) array of non-negative integer counts, got shape {counts.shape}")
    return counts.astype(np.int64), {}


def class_entropy(counts: np.ndarray) -> np.ndarray:
    """Shannon entropy (nats) of each client's label distribution; NaN for an empty client."""
    counts = np.asarray(counts, dtype=np.float64)
    totals = counts.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = counts / totals
        ent = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=1)
    ent[totals[:, 0] == 0] = np.nan
    return ent


def partition_summary(store_or_counts: Any) -> dict[str, Any]:
    """Summary of a partition: client count, total samples, size min/median/mean/max/std, empty
    clients, mean per-client class entropy (nats, over non-empty clients; also normalised by log C),
    mean number of classes per client, and the partition's name/hash/params when given a store."""
    counts, info = _counts_of(store_or_counts)
    n, c = counts.shape
    sizes = counts.sum(axis=1)
    nonempty = sizes > 0
    ent = class_entropy(counts)[nonempty] if n else np.zeros(0)
    summary: dict[str, Any] = dict(info)
    summary.update(
        {
            "num_clients": int(n),
            "num_classes": int(c),
            "total_samples": int(sizes.sum()),
            "size_min": int(sizes.min()) if n else 0,
            "size_median": float(np.median(sizes)) if n else 0.0,
            "size_mean": float(sizes.mean()) if n else 0.0,
            "size_max": int(sizes.max()) if n else 0,
            "size_std": float(sizes.std()) if n else 0.0,
            "empty_clients": int((~nonempty).sum()),
            "mean_class_entropy": float(ent.mean()) if ent.size else 0.0,
            "mean_class_entropy_normalized": float(ent.mean() / np.log(c)) if ent.size and c > 1 else 0.0,
            "mean_classes_per_client": float((counts[nonempty] > 0).sum(axis=1).mean()) if nonempty.any() else 0.0,
        }
    )
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    """A two-column text table of :func:`partition_summary`'s result for the CLI."""
    rows: list[tuple[str, str]] = []
    if summary.get("name") is not None:
        params = ", ".join(f"{k}={v}" for k, v in sorted(summary.get("params", {}).items()))
        rows.append(("partition", f"{summary['name']}({params})" if params else str(summary["name"])))
    for key, label in (("hash", "hash"), ("dataset", "dataset"), ("seed", "seed")):
        if summary.get(key) is not None:
            rows.append((label, str(summary[key])))
    rows += [
        ("clients", f"{summary['num_clients']:,}"),
        ("classes", str(summary["num_classes"])),
        ("samples", f"{summary['total_samples']:,}"),
        (
            "size min/median/mean/max",
            f"{summary['size_min']} / {summary['size_median']:g} / {summary['size_mean']:.1f} / {summary['size_max']}",
        ),
        ("size std", f"{summary['size_std']:.1f}"),
        ("empty clients", str(summary["empty_clients"])),
        ("classes per client (mean)", f"{summary['mean_classes_per_client']:.2f}"),
        (
            "class entropy (mean, nats)",
            f"{summary['mean_class_entropy']:.3f} ({summary['mean_class_entropy_normalized']:.1%} of log C)",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def client_rows(store_or_counts: Any) -> list[dict[str, Any]]:
    """One row per client: id, samples, classes held, class entropy (nats), the three largest classes with
    their counts and (for a store of domain data) the client's majority domain."""
    counts, info = _counts_of(store_or_counts)
    classes = info.get("classes") or [str(i) for i in range(counts.shape[1])]
    ent = class_entropy(counts)
    domains = getattr(store_or_counts, "domains", None) if info else None
    rows = []
    for cid, row in enumerate(counts):
        top = [int(c) for c in np.argsort(-row, kind="stable")[:3] if row[c] > 0]
        out = {"client": cid, "samples": int(row.sum()), "classes": int((row > 0).sum()),
               "entropy": float(ent[cid]), "top_classes": " ".join(f"{classes[c]}:{int(row[c])}" for c in top)}
        if domains is not None and int(domains[cid]) >= 0:
            out["domain"] = int(domains[cid])
        rows.append(out)
    return rows


def format_client_rows(rows: list[dict[str, Any]], limit: int | None = 20) -> str:
    """The first ``limit`` rows of :func:`client_rows` as a text table (all rows with ``limit=None``)."""
    shown = rows if limit is None else rows[:limit]
    has_domain = any("domain" in r for r in rows)
    head = f"{'client':>7} {'samples':>8} {'classes':>7} {'entropy':>7}  " + ("domain  " if has_domain else "") + "largest classes"
    lines = [head]
    for r in shown:
        dom = f"{r.get('domain', '-')!s:>6}  " if has_domain else ""
        lines.append(f"{r['client']:>7} {r['samples']:>8} {r['classes']:>7} {r['entropy']:>7.3f}  {dom}{r['top_classes']}")
    if len(shown) < len(rows):
        lines.append(f"... {len(rows) - len(shown):,} more clients")
    return "\n".join(lines)


def plot_label_distribution(store_or_counts: Any, path_png: str | Path, max_clients: int = 100,
                            kind: str = "auto") -> Path:
    """Plot clients x classes (like FedRCL's Figure C) to ``path_png`` and return the path.

    ``kind="auto"``: up to 20 classes, one horizontal stacked bar per client (a colour per class, bar
    length = client size); more classes, a heat map of per-client class proportions.
    ``kind="heatmap"``: a heat map of sample counts (clients x classes). Only the first ``max_clients``
    clients are drawn (the title says so). Uses matplotlib's Agg canvas directly (no pyplot state) and
    writes atomically (temporary file in the same directory, then ``os.replace``).
    """
    if isinstance(max_clients, bool) or not isinstance(max_clients, int) or max_clients < 1:
        raise DataError(f"plot_label_distribution: max_clients must be an integer >= 1, got {max_clients!r}")
    if kind not in ("auto", "heatmap"):
        raise DataError(f"plot_label_distribution: kind must be 'auto' or 'heatmap', got {kind!r}")
    import matplotlib
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    counts, info = _counts_of(store_or_counts)
    n, c = counts.shape
    shown = counts[:max_clients]
    k = shown.shape[0]
    path = Path(path_png)
    if path.suffix.lower() != ".png":
        raise DataError(f"plot_label_distribution: path must end in .png, got {path}")
    height = min(40.0, max(3.0, 0.12 * k + 1.5))
    fig = Figure(figsize=(9, height), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    classes = info.get("classes") or [str(i) for i in range(c)]
    if kind == "heatmap" or c > 20:  # counts (heatmap) or per-client class proportions (auto, many classes)
        if kind == "heatmap":
            values, what = shown, "samples"
        else:
            totals = shown.sum(axis=1, keepdims=True)
            values = np.divide(shown, totals, out=np.zeros(shown.shape, dtype=np.float64), where=totals > 0)
            what = "fraction of client's samples"
        im = ax.imshow(values, aspect="auto", interpolation="nearest", cmap="viridis")
        if c <= 20:
            ax.set_xticks(np.arange(c), [str(x) for x in classes], rotation=90 if c > 10 else 0)
        ax.set_xlabel("class")
        fig.colorbar(im, ax=ax, label=what)
    else:
        palette = matplotlib.colormaps["tab10" if c <= 10 else "tab20"]
        left = np.zeros(k)
        y = np.arange(k)
        for j in range(c):
            ax.barh(y, shown[:, j], left=left, height=0.85, color=palette(j), label=str(classes[j]), linewidth=0)
            left += shown[:, j]
        ax.set_ylim(k - 0.5, -0.5)
        ax.set_xlabel("samples")
        ax.legend(title="class", bbox_to_anchor=(1.01, 1.0), loc="upper left", fontsize="small", frameon=False)
    ax.set_ylabel("client")
    title = "label distribution"
    if info.get("name"):
        params = ", ".join(f"{a}={b}" for a, b in sorted(info.get("params", {}).items()))
        title = f"{info.get('dataset', '')} {info['name']}({params})".strip()
    if k < n:
        title += f" - first {k} of {n} clients"
    ax.set_title(title, fontsize="medium")
    fig.tight_layout()
    with atomic_writer(path, suffix=".tmp.png") as fh:
        fig.savefig(fh, format="png")
    return path
