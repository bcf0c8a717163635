"""fedray.data.stats: partition summaries and the label-distribution plot."""

from __future__ import annotations

import numpy as np
import pytest

from fedray.data.stats import format_summary, partition_summary, plot_label_distribution
from fedray.data.store import build_partition
from fedray.data.table import DataError
from tests.data.bundles import N_ROWS


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
