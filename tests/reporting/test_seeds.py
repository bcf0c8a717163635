"""fedray.reporting.seeds: runs grouped over seeds, mean ± std, rounds to a target, the pivot table's formats
(run directories written file by file: nothing is trained)."""

from __future__ import annotations

import csv
import io
import math

import numpy as np
import pytest

from fedray.reporting.report import summarize
from fedray.reporting.rundir import RunDir
from fedray.reporting.seeds import (format_cell, group_runs, mean_std, pivot, pivot_csv, pivot_latex,
                                    pivot_markdown, rounds_to_target)
from tests.reporting.rundirs import grid, read_metric, write_run


def _groups(paths):
    rds = [RunDir(p) for p in paths]
    return group_runs(rds, [summarize(rd) for rd in rds])


@pytest.fixture()
def runs(tmp_path):
    return grid(tmp_path / "runs")


def test_runs_that_differ_only_by_seed_form_one_group(runs):
    groups, notes = _groups([p for ps in runs.values() for p in ps])
    assert not notes
    assert [len(g.runs) for g in groups] == [3, 3, 3, 3, 1]
    by_label = {g.label: g for g in groups}
    assert set(by_label) == {"fedavg α=0.05, lr=0.05", "fedavg α=0.3, lr=0.05", "fedprox α=0.05, lr=0.05",
                             "fedprox α=0.3, lr=0.05", "fedavg α=0.05, lr=0.01"}
    for (alg, alpha), paths in runs.items():
        if alg == "fedavg-lr":
            continue
        g = by_label[f"{alg} α={alpha}, lr=0.05"]
        assert [rd.path for rd in g.runs] == paths and g.seeds == [0, 1, 2]
    assert by_label["fedavg α=0.05, lr=0.01"].runs[0].path == runs[("fedavg-lr", 0.05)][0]


def test_a_repeated_seed_is_left_out_and_noted(tmp_path):
    a = write_run(tmp_path, "a", [0.5, 0.6], seed=1)
    b = write_run(tmp_path, "b", [0.5, 0.7], seed=1, extra={"engine": {"backend": "local"}})
    groups, notes = _groups([a, b])
    assert len(groups) == 1 and [rd.path for rd in groups[0].runs] == [a]
    assert len(notes) == 1 and "repeats seed 1" in notes[0]


def test_method_labels_name_the_server_optimizer_and_the_params_that_differ(tmp_path):
    paths = [write_run(tmp_path, "avg", [0.5]),
             write_run(tmp_path, "adam", [0.5], extra={"server": {"name": "fedadam"}}),
             write_run(tmp_path, "prox1", [0.5], algorithm="fedprox", extra={"algorithm": {"params": {"mu": 0.01}}}),
             write_run(tmp_path, "prox2", [0.5], algorithm="fedprox", extra={"algorithm": {"params": {"mu": 0.1}}})]
    groups, _ = _groups(paths)
    assert [g.method for g in groups] == ["fedavg", "fedavg+fedadam", "fedprox (mu=0.01)", "fedprox (mu=0.1)"]
    assert all(g.setting == "" for g in groups)  # nothing but the method varies: one column
    assert pivot(groups).cols == ["final accuracy (%)"]


def test_mean_and_std_are_numpys_on_the_rows_written(runs):
    groups, _ = _groups([p for ps in runs.values() for p in ps])
    g = next(g for g in groups if g.label == "fedprox α=0.3, lr=0.05")
    final = [read_metric(rd.path, "accuracy")[-1] for rd in g.runs]
    ema = [read_metric(rd.path, "ema_accuracy")[-1] for rd in g.runs]
    best = [max(read_metric(rd.path, "accuracy")) for rd in g.runs]
    for metric, values in (("accuracy", final), ("ema_accuracy", ema), ("best_accuracy", best)):
        st = g.stat(metric)
        assert st.mean == pytest.approx(np.mean(values), abs=1e-15)
        assert st.std == pytest.approx(np.std(values, ddof=1), abs=1e-15)
        assert (st.n, st.total) == (3, 3)
    assert format_cell(g.stat("accuracy"), "accuracy") == (
        f"{100 * np.mean(final):.2f} ± {100 * np.std(final, ddof=1):.2f}")
    single = next(g for g in groups if len(g.runs) == 1)
    assert math.isnan(single.stat("accuracy").std) and format_cell(single.stat("accuracy"), "accuracy").endswith("± –")


def test_rounds_to_target_counts_seeds_that_never_reach_it(tmp_path):
    assert rounds_to_target([{"round": 1}, {"round": 2, "accuracy": 0.79}, {"round": 3, "accuracy": 0.8}], 0.8) == 3
    assert math.isnan(rounds_to_target([{"round": 1, "accuracy": 0.5}], 0.8))
    paths = [write_run(tmp_path, "s0", [0.5, 0.7, 0.81, 0.9, 0.7], seed=0),  # reaches 0.8 at round 3
             write_run(tmp_path, "s1", [0.5, None, 0.6, 0.7, 0.85], seed=1),  # round 2 not evaluated; round 5
             write_run(tmp_path, "s2", [0.5, 0.6, 0.7, 0.79, 0.75], seed=2)]  # never reaches 0.8
    (g,), _ = _groups(paths)
    assert g.values("rounds_to_target", 0.8)[:2] == [3.0, 5.0] and math.isnan(g.values("rounds_to_target", 0.8)[2])
    st = g.stat("rounds_to_target", 0.8)
    assert (st.mean, st.std, st.n, st.total) == (4.0, pytest.approx(np.std([3, 5], ddof=1)), 2, 3)
    assert format_cell(st, "rounds_to_target") == "4.0 ± 1.4 (2/3)"
    assert format_cell(g.stat("rounds_to_target", 0.95), "rounds_to_target") == "not reached (0/3)"
    with pytest.raises(ValueError, match="target"):
        g.stat("rounds_to_target")
    assert mean_std([]).n == 0


def test_pivot_in_markdown_csv_and_latex(runs):
    groups, _ = _groups([p for ps in runs.values() for p in ps])
    p = pivot(groups, "ema_accuracy")
    assert p.rows == ["fedavg", "fedprox"]
    assert p.cols == ["α=0.05, lr=0.01", "α=0.05, lr=0.05", "α=0.3, lr=0.05"]
    assert ("fedprox", "α=0.05, lr=0.01") not in p.cells  # no such run: an empty cell

    rows = list(csv.DictReader(io.StringIO(pivot_csv(p))))
    assert [r["method"] for r in rows] == ["fedavg", "fedprox"]
    for (alg, alpha), paths in runs.items():
        if alg == "fedavg-lr":
            continue
        row = next(r for r in rows if r["method"] == alg)
        values = [read_metric(q, "ema_accuracy")[-1] for q in paths]
        assert float(row[f"α={alpha}, lr=0.05 mean"]) == pytest.approx(np.mean(values), abs=1e-15)
        assert float(row[f"α={alpha}, lr=0.05 std"]) == pytest.approx(np.std(values, ddof=1), abs=1e-15)
        assert row[f"α={alpha}, lr=0.05 n"] == row[f"α={alpha}, lr=0.05 seeds"] == "3"
    fedavg = next(r for r in rows if r["method"] == "fedavg")
    assert fedavg["α=0.05, lr=0.01 std"] == "" and fedavg["α=0.05, lr=0.01 n"] == "1"

    best = p.best()
    for c in p.cols:  # the best cell of each column has the highest mean
        top = max((st.mean, r) for (r, cc), st in p.cells.items() if cc == c)
        assert (top[1], c) in best
    md = pivot_markdown(p)
    assert md.splitlines()[2] == "| method | α=0.05, lr=0.01 | α=0.05, lr=0.05 | α=0.3, lr=0.05 |"
    assert md.count("**") == 2 * len(best)

    tex = pivot_latex(p)
    assert r"\toprule" in tex and r"\midrule" in tex and r"\bottomrule" in tex
    assert r"\begin{tabular}{lccc}" in tex and r"$\alpha$=0.3, lr=0.05" in tex
    r, c = next((r, c) for r, c in sorted(best) if p.cells[(r, c)].n == 3)
    st = p.cells[(r, c)]
    line = next(line for line in tex.splitlines() if line.startswith(r + " &"))
    cell = line.rstrip(" \\").split(" & ")[1 + p.cols.index(c)]
    assert cell == rf"\textbf{{{100 * st.mean:.2f} $\pm$ {100 * st.std:.2f}}}"
    assert tex.count(r"\textbf{") == len(best)


def test_pivot_of_rounds_to_target_ranks_reached_seeds_first(tmp_path):
    paths = [write_run(tmp_path, "fast", [0.9, 0.9], algorithm="fedavg", seed=0),
             write_run(tmp_path, "fast1", [0.5, 0.5], algorithm="fedavg", seed=1),  # fedavg: 1 of 2 reach, round 1
             write_run(tmp_path, "slow", [0.5, 0.85], algorithm="fedprox", seed=0),
             write_run(tmp_path, "slow1", [0.5, 0.85], algorithm="fedprox", seed=1)]  # fedprox: 2 of 2, round 2
    groups, _ = _groups(paths)
    p = pivot(groups, "rounds_to_target", 0.8)
    assert p.best() == {("fedprox", "rounds to 0.8 accuracy")}
    assert "1.0 ± – (1/2)" in pivot_markdown(p) and "**2.0 ± 0.0**" in pivot_markdown(p)
    with pytest.raises(ValueError, match="metric"):
        pivot(groups, "loss")


def test_tables_labelled_by_named_fields_and_per_round_reductions(runs):
    """fedray sweep's tables: rows / columns named by config fields; REDUCTION:KEY cells over metrics.jsonl rows."""
    from fedray.reporting.seeds import check_metric, field_label, label_by, reduce_rounds

    runs = {k: v for k, v in runs.items() if k[0] in ("fedavg", "fedprox")}  # not the fedavg with another lr
    groups, _ = _groups([p for paths in runs.values() for p in paths])
    label_by(groups, ["algorithm.name"], ["data.partition.params.alpha"])
    assert {g.method for g in groups} == {k[0] for k in runs}
    assert {g.setting for g in groups} == {f"α={a:g}" for _, a in runs}
    assert field_label({"algorithm.params.mu": 0.01, "algorithm.params.beta": 1.0}, ["algorithm.params"]) \
        == "params=beta=1,mu=0.01"
    assert field_label({"train.lr": 0.1}, ["algorithm.params.tau"]) == "tau=-"  # a field the run does not have
    rows = [{"round": 1, "loss": 3.0, "bytes": {"upload": 10}}, {"round": 2, "loss": 1.0}, {"round": 3, "loss": 2.0}]
    assert (reduce_rounds(rows, "loss", "last"), reduce_rounds(rows, "loss", "min"), reduce_rounds(rows, "loss", "mean"),
            reduce_rounds(rows, "bytes.upload", "max")) == (2.0, 1.0, 2.0, 10.0)
    assert math.isnan(reduce_rounds(rows, "analysis.vci", "last"))
    piv = pivot(groups, "mean:loss", first_seen=True)
    (method, alpha), paths = next(iter(runs.items()))
    expected = np.mean([np.mean(read_metric(p, "loss")) for p in paths])
    assert piv.cells[(method, f"α={alpha:g}")].mean == pytest.approx(expected, rel=1e-12)
    assert piv.best() == set()  # which end of a loss / byte count is best is not assumed
    for bad in ("loss", "median:loss", "last:", "last:a..b"):
        with pytest.raises(ValueError, match="REDUCTION:KEY"):
            check_metric(bad)
