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


def _old_client_rows(counts, classes, domains):
    """client_rows as it was: every client's dict from the whole counts array."""
    from fedray.data.stats import class_entropy

    ent = class_entropy(counts)
    rows = []
    for cid, row in enumerate(counts):
        top = [int(c) for c in np.argsort(-row, kind="stable")[:3] if row[c] > 0]
        out = {"client": cid, "samples": int(row.sum()), "classes": int((row > 0).sum()),
               "entropy": float(ent[cid]), "top_classes": " ".join(f"{classes[c]}:{int(row[c])}" for c in top)}
        if domains is not None and int(domains[cid]) >= 0:
            out["domain"] = int(domains[cid])
        rows.append(out)
    return rows


def _old_csv(rows) -> str:
    import csv
    import io

    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in rows for k in r)), restval="", lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


@pytest.mark.parametrize("spec", [{"name": "dirichlet", "num_clients": 40, "seed": 0, "alpha": 0.05},
                                  {"name": "domain", "num_clients": 6, "seed": 0, "clients_per_domain": 2}])
def test_streamed_statistics_equal_those_of_the_whole_counts_array(tmp_path, bundle, monkeypatch, spec):
    import fedray.data.manifest as manifest
    from fedray.data.stats import client_rows, format_client_rows, plot_client_summary, write_client_table

    monkeypatch.setattr(manifest, "CLIENTS_PER_GROUP", 7)  # many row groups: every statistic is streamed
    st = build_partition(bundle, spec, tmp_path / "p")
    assert [lo for lo, _ in st.iter_class_counts()] == list(range(0, st.num_clients, 7))
    counts = st.class_counts()
    assert counts.shape == (st.num_clients, 10) and np.array_equal(counts.sum(axis=1), st.sizes)
    whole, streamed = partition_summary(counts), partition_summary(st)
    assert streamed["name"] == spec["name"] and streamed["hash"] == st.hash
    assert {k: streamed[k] for k in whole} == pytest.approx(whole, rel=1e-12)  # entropy: summed chunk by chunk
    old = _old_client_rows(counts, [str(c) for c in range(10)], st.domains)
    assert repr(client_rows(st)) == repr(old) and repr(client_rows(st, 5)) == repr(old[:5])  # NaN: empty clients
    assert format_client_rows(old[:5], None, total=len(old)).endswith(f"... {len(old) - 5:,} more clients")
    assert write_client_table(st, tmp_path / "clients.csv").read_text() == _old_csv(old)
    assert plot_client_summary(st, tmp_path / "summary.png").read_bytes()[:4] == b"\x89PNG"


def test_class_names_with_commas_are_quoted_in_the_table(tmp_path):
    from fedray.data.stats import write_client_table

    counts = np.array([[3, 0, 1], [0, 0, 0]])
    rows = _old_client_rows(counts, ["0", "1", "2"], None)
    assert write_client_table(counts, tmp_path / "c.csv").read_text() == _old_csv(rows)
