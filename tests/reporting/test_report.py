"""fedray.reporting.report / ``fedray report``: per-run and over-seeds tables and the band plot, from run
directories written file by file (nothing is trained, Ray is not started)."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

import fedray.reporting.report as report_mod
from fedray.cli import main
from fedray.reporting.report import report
from tests.reporting.rundirs import grid, read_metric, write_run


@pytest.fixture()
def runs(tmp_path):
    return grid(tmp_path / "runs")


def _curves(monkeypatch) -> list:
    """Spy on the report's curves: (label, std given) of each line drawn."""
    drawn = []
    real = report_mod._curve

    def spy(ax, label, rounds, mean, std=None):
        drawn.append((label, std is not None))
        real(ax, label, rounds, mean, std)

    monkeypatch.setattr(report_mod, "_curve", spy)
    return drawn


def test_report_over_seeds_writes_tables_and_band_plot(runs, tmp_path, monkeypatch, capsys):
    drawn = _curves(monkeypatch)
    paths = [str(p) for ps in runs.values() for p in ps]
    out = tmp_path / "rep"
    assert main(["report", *paths, "--out", str(out), "--metric", "ema_accuracy", "--target", "0.8"]) == 0
    printed = capsys.readouterr().out
    assert (out / "table.md").read_text().strip() in printed  # the pivot is printed
    assert "| experiment | seeds |" in printed and "rounds to 0.8 accuracy" in printed
    for name in ("summary.md", "summary.csv", "groups.md", "groups.csv", "table.md", "table.csv", "table.tex",
                 "accuracy.png", "loss.png"):
        assert f"wrote {out / name}" in printed
    assert (out / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # one line per group with a band (accuracy, EMA, loss), not one per run
    assert len(drawn) == 3 * 5 and all(has_band for _, has_band in drawn)
    assert "fedprox α=0.3, lr=0.05 (n=3)" in {label for label, _ in drawn}
    # the per-run table is today's: one row per run
    assert len((out / "summary.md").read_text().splitlines()) == 2 + len(paths)
    assert len(list(csv.DictReader(io.StringIO((out / "summary.csv").read_text())))) == len(paths)

    groups = {r["experiment"]: r for r in csv.DictReader(io.StringIO((out / "groups.csv").read_text()))}
    assert sorted(int(r["seeds"]) for r in groups.values()) == [1, 3, 3, 3, 3]
    g = groups["fedavg α=0.3, lr=0.05"]
    final = [read_metric(p, "accuracy")[-1] for p in runs[("fedavg", 0.3)]]
    assert float(g["accuracy_mean"]) == pytest.approx(np.mean(final), abs=1e-15)
    assert float(g["accuracy_std"]) == pytest.approx(np.std(final, ddof=1), abs=1e-15)
    assert g["seed_values"] == "0 1 2" and "rounds_to_target_mean" in g
    table = list(csv.DictReader(io.StringIO((out / "table.csv").read_text())))
    ema = [read_metric(p, "ema_accuracy")[-1] for p in runs[("fedprox", 0.05)]]
    assert float(table[1]["α=0.05, lr=0.05 mean"]) == pytest.approx(np.mean(ema), abs=1e-15)
    assert r"\toprule" in (out / "table.tex").read_text()


def test_report_keeps_per_run_curves_when_every_group_has_one_run(tmp_path, monkeypatch, capsys):
    drawn = _curves(monkeypatch)
    a = write_run(tmp_path, "a", [0.5, 0.6, 0.7])
    b = write_run(tmp_path, "b", [0.4, 0.6, 0.8], algorithm="fedprox")
    text, files = report([a, b], tmp_path / "rep")
    assert drawn and not any(has_band for _, has_band in drawn)
    assert {label for label, _ in drawn} == {"fedavg α=0.3 [a]", "fedprox α=0.3 [b]"}
    assert (tmp_path / "rep" / "accuracy.png").stat().st_size > 1000 and tmp_path / "rep" / "table.tex" in files
    assert "| fedprox | **80.00 ± –** |" in text
    one, _ = report([a], tmp_path / "one")
    assert one == (tmp_path / "one" / "summary.md").read_text().strip()  # one run: the per-run table only


def test_report_refuses_a_bad_metric_or_target(tmp_path, capsys):
    a = write_run(tmp_path, "a", [0.5])
    assert main(["report", str(a), "--metric", "rounds_to_target"]) == 2
    assert "needs --target" in capsys.readouterr().err
    assert main(["report", str(a), "--target", "80"]) == 2
    assert "(0, 1]" in capsys.readouterr().err


def _with_eval_metrics(path, values: list[dict]) -> None:
    """Add eval.metrics values to the evaluated rows of a written run (one dict per evaluated round)."""
    rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
    it = iter(values)
    for r in rows:
        if r.get("accuracy") is not None:
            r.update(next(it))
    (path / "metrics.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def test_report_of_an_eval_metric_over_seeds(tmp_path, capsys):
    """--metric NAME of eval.metrics: its final value, mean ± std over the seeds, as the accuracies are (a value of
    a metric with several as NAME.KEY; REDUCTION:KEY over the rounds); a name no run recorded is refused."""
    metrics = {"eval": {"metrics": ["balanced_accuracy", "per_class_accuracy"]}}
    paths = []
    for seed, final in enumerate((0.5, 0.7)):
        p = write_run(tmp_path, f"s{seed}", [0.4, None, 0.6], seed=seed, extra=metrics)
        _with_eval_metrics(p, [{"balanced_accuracy": 0.3, "per_class_accuracy": {"0": 0.2, "1": 0.4}},
                               {"balanced_accuracy": final, "per_class_accuracy": {"0": final - 0.1, "1": 0.9}}])
        paths.append(str(p))
    out = tmp_path / "rep"
    assert main(["report", *paths, "--out", str(out), "--metric", "balanced_accuracy"]) == 0
    text = capsys.readouterr().out
    assert "final balanced_accuracy (%), mean ± std over seeds" in text and "| fedavg | **60.00 ± 14.14** |" in text
    groups = (out / "groups.md").read_text()
    assert "final balanced_accuracy (%)" in groups.splitlines()[0] and "60.00 ± 14.14" in groups
    assert "balanced_accuracy_mean" in (out / "groups.csv").read_text().splitlines()[0]
    assert (out / "summary.md").read_text().splitlines()[0].endswith("| failures | balanced_accuracy |")
    csv_header = (out / "summary.csv").read_text().splitlines()[0].split(",")
    assert csv_header[-3:] == ["balanced_accuracy", "per_class_accuracy.0", "per_class_accuracy.1"]
    assert main(["report", *paths, "--out", str(out), "--metric", "per_class_accuracy.0"]) == 0
    assert "| fedavg | 50.00 ± 14.14 |" not in capsys.readouterr().out  # a per-class value is not shown in %
    assert "0.5000 ± 0.1414" in (out / "table.md").read_text()
    assert main(["report", *paths, "--out", str(out), "--metric", "mean:balanced_accuracy"]) == 0
    assert "45.00 ± 7.07" in (out / "table.md").read_text()
    for bad in ("per_class_accuracy", "macro_f1"):  # a metric with several values, one the runs did not compute
        assert main(["report", *paths, "--out", str(out), "--metric", bad]) == 2
        assert (f"--metric {bad!r}: no run recorded it (the runs' eval.metrics values: balanced_accuracy, "
                f"per_class_accuracy.0, per_class_accuracy.1)") in capsys.readouterr().err
    assert main(["report", *paths, "--out", str(out), "--metric", "loss"]) == 2  # a key of fedray's own rows
    assert "a metric of eval.metrics (NAME, or NAME.KEY" in capsys.readouterr().err
