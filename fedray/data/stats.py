"""Label-distribution statistics of a partition: a summary dict, a text table, the per-client CSV and plots.

All functions accept either a :class:`~fedray.data.store.PartitionStore` or an ``(N, C)`` array of
per-client class counts (as returned by :func:`fedray.data.partition.label_stats`). A store's class counts are
read a manifest row group (about a million clients) at a time, so summaries, ``clients.csv`` and the plots of
a ten-million-client partition never hold every client's counts at once; the plots draw the first clients and
summaries over all of them (``client_summary.png``), never ten million rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from fedray.core.io import atomic_writer

from .table import DataError

__all__ = ["partition_summary", "format_summary", "plot_label_distribution", "plot_client_summary", "class_entropy",
           "client_rows", "format_client_rows", "write_client_table"]


def _is_store(obj: Any) -> bool:
    return hasattr(obj, "iter_class_counts") and hasattr(obj, "spec")


def _chunks_of(store_or_counts: Any) -> tuple[Iterator[tuple[int, np.ndarray]], int, int, dict[str, Any]]:
    """``(chunks, num_clients, num_classes, info)``: ``chunks`` yields ``(first client, counts)`` of a store's
    manifest row group by row group, or the one chunk of an (N, C) counts array."""
    if _is_store(store_or_counts):
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
        return store.iter_class_counts(), store.num_clients, store.meta.num_classes, info
    counts = np.asarray(store_or_counts)
    if counts.ndim != 2 or (counts.size and not np.issubdtype(counts.dtype, np.integer)) or (counts.size and counts.min() < 0):
        raise DataError(f"expected a PartitionStore or an (N, C) array of non-negative integer counts, got shape {counts.shape}")
    return iter([(0, counts.astype(np.int64))]), counts.shape[0], counts.shape[1], {}


def _counts_of(store_or_counts: Any, first: int | None = None) -> tuple[np.ndarray, int, dict[str, Any]]:
    """``(counts of the first ``first`` clients (all with None), num_clients, info)``."""
    chunks, n, c, info = _chunks_of(store_or_counts)
    want = n if first is None else min(n, first)
    out = np.zeros((want, c), dtype=np.int64)
    for lo, counts in chunks:
        if lo >= want:
            break
        out[lo:lo + counts.shape[0]] = counts[: want - lo]
    return out, n, info


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
    mean number of classes per client, and the partition's name/hash/params when given a store
    (streamed over the clients' class counts)."""
    chunks, n, c, info = _chunks_of(store_or_counts)
    sizes = np.zeros(n, dtype=np.int64)
    ent_sum, ent_n, held = 0.0, 0, 0
    for lo, counts in chunks:
        sz = counts.sum(axis=1)
        sizes[lo:lo + sz.size] = sz
        full = counts[sz > 0]
        ent = class_entropy(full)
        ent_sum, ent_n, held = ent_sum + float(ent.sum()), ent_n + ent.size, held + int((full > 0).sum())
    nonempty = int((sizes > 0).sum())
    ent_mean = ent_sum / ent_n if ent_n else 0.0
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
            "empty_clients": int(n - nonempty),
            "mean_class_entropy": ent_mean,
            "mean_class_entropy_normalized": ent_mean / float(np.log(c)) if ent_n and c > 1 else 0.0,
            "mean_classes_per_client": held / nonempty if nonempty else 0.0,
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


def _top_texts(counts: np.ndarray, classes: list[str]) -> list[str]:
    """Each client's three largest classes by count (ties: the lower class first) as ``name:count`` joined by
    spaces, classes it does not hold left out (vectorised with Arrow's string kernels: the classes a client holds
    come first, so its text joins the first k pieces)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    top = np.argsort(-counts, axis=1, kind="stable")[:, :3]
    top_n = np.take_along_axis(counts, top, axis=1)
    names = pa.array([f"{c}:" for c in classes])
    pieces = [pc.binary_join_element_wise(names.take(pa.array(np.ascontiguousarray(top[:, j]))),
                                          pa.array(np.ascontiguousarray(top_n[:, j])).cast(pa.string()), "")
              for j in range(top.shape[1])]
    held = pa.array((top_n > 0).sum(axis=1))
    text = pa.array([""] * counts.shape[0], pa.string())
    for k in range(1, len(pieces) + 1):
        joined = pieces[0] if k == 1 else pc.binary_join_element_wise(*pieces[:k], " ")
        text = pc.if_else(pc.equal(held, k), joined, text)
    return text.to_pylist()


def _row_fields(counts: np.ndarray, lo: int, classes: list[str]) -> Iterator[tuple[int, int, int, float, str]]:
    """``(client, samples, classes held, entropy, largest classes)`` of the clients of ``counts`` (client ``lo``
    first): the largest three classes by count (ties: the lower class first) as ``name:count``."""
    return zip(range(lo, lo + counts.shape[0]), counts.sum(axis=1).tolist(), (counts > 0).sum(axis=1).tolist(),
               class_entropy(counts).tolist(), _top_texts(counts, classes))


def _csv_field(text: str) -> str:
    """``text`` as a CSV field (quoted when it holds a comma, a quote or a line break, as :mod:`csv` does)."""
    return '"' + text.replace('"', '""') + '"' if any(ch in text for ch in ',"\r\n') else text


def client_rows(store_or_counts: Any, limit: int | None = None) -> list[dict[str, Any]]:
    """One row per client (the first ``limit`` clients; all with None): id, samples, classes held, class entropy
    (nats), the three largest classes with their counts and (for a store of domain data) the client's majority
    domain. ``clients.csv`` holds every client (:func:`write_client_table`)."""
    counts, _, info = _counts_of(store_or_counts, limit)
    classes = info.get("classes") or [str(i) for i in range(counts.shape[1])]
    domains = store_or_counts.domains if _is_store(store_or_counts) else None
    rows = []
    for cid, samples, held, ent, top in _row_fields(counts, 0, classes):
        out = {"client": cid, "samples": samples, "classes": held, "entropy": ent, "top_classes": top}
        if domains is not None and int(domains[cid]) >= 0:
            out["domain"] = int(domains[cid])
        rows.append(out)
    return rows


def write_client_table(store_or_counts: Any, path: str | Path) -> Path:
    """Write ``clients.csv`` (the columns of :func:`client_rows`, every client, ``domain`` only when some client
    has one) streamed a chunk of clients at a time, atomically."""
    chunks, n, c, info = _chunks_of(store_or_counts)
    classes = info.get("classes") or [str(i) for i in range(c)]
    domains = store_or_counts.domains if _is_store(store_or_counts) else None
    has_domain = domains is not None and n > 0 and bool(np.any(domains >= 0))
    quote = any(_csv_field(c) != c for c in classes)
    path = Path(path)
    with atomic_writer(path, suffix=".tmp.csv") as fh:
        fh.write(("client,samples,classes,entropy,top_classes" + (",domain" if has_domain else "") + "\n").encode())
        for lo, counts in chunks:
            dom = domains[lo:lo + counts.shape[0]].tolist() if has_domain and domains is not None else None
            field = _csv_field if quote else str
            if dom is None:
                lines = [f"{cid},{samples},{held},{ent!r},{field(top)}"
                         for cid, samples, held, ent, top in _row_fields(counts, lo, classes)]
            else:
                lines = [f"{cid},{samples},{held},{ent!r},{field(top)}," + (str(d) if d >= 0 else "")
                         for (cid, samples, held, ent, top), d in zip(_row_fields(counts, lo, classes), dom)]
            fh.write(("\n".join(lines) + "\n").encode() if lines else b"")
    return path


def format_client_rows(rows: list[dict[str, Any]], limit: int | None = 20, total: int | None = None) -> str:
    """The first ``limit`` rows of :func:`client_rows` as a text table (all rows with ``limit=None``); ``total``:
    how many clients there are (default ``len(rows)``), for the closing ``... N more clients``."""
    shown = rows if limit is None else rows[:limit]
    total = len(rows) if total is None else total
    has_domain = any("domain" in r for r in rows)
    head = f"{'client':>7} {'samples':>8} {'classes':>7} {'entropy':>7}  " + ("domain  " if has_domain else "") + "largest classes"
    lines = [head]
    for r in shown:
        dom = f"{r.get('domain', '-')!s:>6}  " if has_domain else ""
        lines.append(f"{r['client']:>7} {r['samples']:>8} {r['classes']:>7} {r['entropy']:>7.3f}  {dom}{r['top_classes']}")
    if len(shown) < total:
        lines.append(f"... {total - len(shown):,} more clients")
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

    shown, n, info = _counts_of(store_or_counts, max_clients)
    k, c = shown.shape
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


def plot_client_summary(store_or_counts: Any, path_png: str | Path) -> Path:
    """Two histograms over every client (streamed): client sizes (log-spaced bins when sizes span more than 100)
    and classes held per client; written atomically to ``path_png``, which is returned."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    chunks, n, c, info = _chunks_of(store_or_counts)
    sizes = np.zeros(n, dtype=np.int64)
    held = np.zeros(c + 1, dtype=np.int64)
    for lo, counts in chunks:
        sizes[lo:lo + counts.shape[0]] = counts.sum(axis=1)
        held += np.bincount((counts > 0).sum(axis=1), minlength=c + 1)
    path = Path(path_png)
    if path.suffix.lower() != ".png":
        raise DataError(f"plot_client_summary: path must end in .png, got {path}")
    top = int(sizes.max()) if n else 0
    edges = np.unique(np.geomspace(1, top + 1, 60).astype(np.int64)) if top > 100 else np.arange(0, top + 2)
    hist, edges = np.histogram(sizes, bins=edges)
    fig = Figure(figsize=(10, 3.6), dpi=100)
    FigureCanvasAgg(fig)
    ax1, ax2 = fig.subplots(1, 2)
    ax1.stairs(hist, edges, fill=True)
    ax1.set(xlabel="samples per client", ylabel="clients", yscale="log" if hist.max(initial=0) > 100 else "linear")
    if top > 100:
        ax1.set_xscale("log")
    ax2.bar(np.arange(c + 1), held, width=0.85)
    ax2.set(xlabel="classes held", ylabel="clients", yscale="log" if held.max(initial=0) > 100 else "linear")
    name = f"{info.get('dataset', '')} {info['name']}".strip() if info.get("name") else "partition"
    fig.suptitle(f"{name}: {n:,} clients, {int(sizes.sum()):,} samples, {int((sizes == 0).sum()):,} empty",
                 fontsize="medium")
    fig.tight_layout()
    with atomic_writer(path, suffix=".tmp.png") as fh:
        fig.savefig(fh, format="png")
    return path
