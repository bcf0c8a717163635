"""fedray.data.stats: partition summaries and the label-distribution plot."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from fedray.data.stats import format_summary, partition_summary, plot_label_distribution
from fedray.data.store import build_partition
from fedray.data.table import DataBundle, DataError, DatasetMeta, Split, make_table

N_ROWS = 1200


def _bundle(n=N_ROWS, *, with_domain=True, natural=False, fingerprint="toy-v1", seed=0) -> DataBundle:
    rng = np.random.default_rng(seed)
    meta = DatasetMeta(
        "toy", 10, (1, 28, 28), mean=(0.13,), std=(0.31,), domains=("a", "b", "c") if with_domain else ()
    )
    x = rng.integers(0, 256, (n, 1, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, n)
    d = (np.arange(n) % 3).astype(np.int32) if with_domain else None
    table = make_table(x, y, meta, d)
    if natural:
        table = table.append_column("client", pa.array((np.arange(n) % 7).astype(np.int64)))
    train = Split(table, meta)
    test = Split(make_table(x[:20], y[:20], meta, None if d is None else d[:20]), meta)
    return DataBundle(train, test, meta, fingerprint=fingerprint)


@pytest.fixture(scope="module")
def bundle() -> DataBundle:
    return _bundle()


# ---------------------------------------------------------------------------------------------
# statistics


def test_summary_and_plot(tmp_path, bundle):
    st = build_partition(bundle, {"name": "balanced_dirichlet", "num_clients": 12, "seed": 0, "alpha": 0.1}, tmp_path / "p")
    s = partition_summary(st)
    assert s["num_clients"] == 12 and s["size_min"] == s["size_max"] == N_ROWS // 12 and s["empty_clients"] == 0
    assert s["name"] == "balanced_dirichlet" and s["hash"] == st.hash
    assert 0 < s["mean_class_entropy"] < np.log(10)
    text = format_summary(s)
    assert "balanced_dirichlet" in text and "empty clients" in text
    out = plot_label_distribution(st, tmp_path / "plots" / "labels.png", max_clients=5)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in out.parent.iterdir()) == ["labels.png"]
    wide = np.random.default_rng(0).integers(0, 5, (30, 40))
    assert plot_label_distribution(wide, tmp_path / "wide.png").stat().st_size > 0
    assert plot_label_distribution(st, tmp_path / "heat.png", kind="heatmap").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(DataError, match="kind"):
        plot_label_distribution(st, tmp_path / "x.png", kind="pie")
    with pytest.raises(DataError, match="counts"):
        partition_summary(np.array([1, 2, 3]))
