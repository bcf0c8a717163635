"""A sweep table beside the paper's numbers (fedray/reporting/paper.py): the parsing and its errors, each cell's gap
in the paper's spread, the claims, the labels checked when the sweep file loads, and ``fedray report --sweep`` over
the FedCCL Table 4 runs kept in docs/results."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from fedray.apps.sweep_spec import load_sweep
from fedray.cli import main as cli
from fedray.config import ConfigError
from fedray.reporting.paper import paper_markdown, parse_paper
from fedray.reporting.seeds import Pivot, Stat
from tests.apps.sweeps import tiny_base
from tests.helpers import ROOT


def _paper(**over) -> dict:
    raw = {"source": "Paper, Table 1", "metric": "accuracy",
           "cells": {"ours": {"a": "90.0 ± 0.5", "b": 80}, "base": {"a": "85.0 +- 1.0", "b": "-"}},
           "claims": [{"row": "ours", "above": "all"}]}
    raw.update(over)
    return parse_paper(raw, "tables[0].paper", ["accuracy", "mean_last5"])


@pytest.mark.parametrize("over, message", [
    ({"metric": "loss"}, r"tables\[0\].paper.metric: 'loss' is not one of the table's metrics"),
    ({"cells": {"ours": {"a": "ninety"}}}, r"tables\[0\].paper.cells.ours.a: expected a number, 'mean ± std' or '-'"),
    ({"cells": {"ours": {"a": True}}}, r"tables\[0\].paper.cells.ours.a: expected a number"),
    ({"cells": [90.7]}, r"tables\[0\].paper.cells: expected a mapping row"),
    ({"claims": [{"row": "ours"}]}, r"tables\[0\].paper.claims\[0\]: expected \{row: ROW, above"),
    ({"claims": [{"row": "ours", "above": "most"}]}, r"claims\[0\].above: expected all or a list of rows"),
    ({"claims": [{"row": "ours", "above": "all", "by": 2}]}, r"claims\[0\].by: unknown field"),
    ({"table": 4}, r"tables\[0\].paper.table: unknown field"),
])
def test_a_bad_paper_block_is_refused_naming_the_field(over, message):
    with pytest.raises(ConfigError, match=message):
        _paper(**over)


def test_values_parse_as_mean_and_spread_or_a_failure():
    p = _paper()
    assert p["cells"]["ours"] == {"a": {"mean": 90.0, "std": 0.5}, "b": {"mean": 80.0, "std": None}}
    assert p["cells"]["base"] == {"a": {"mean": 85.0, "std": 1.0}, "b": {"failed": True}}
    assert p["claims"] == [{"row": "ours", "above": "all", "columns": None}]


def test_cells_gaps_in_paper_spreads_and_the_claims():
    cells = {("ours", "a"): Stat(0.89, 0.01, 2, 2),  # 89.00 ± 1.00 against 90.0 ± 0.5: 2 spreads under
             ("base", "a"): Stat(0.86, math.nan, 1, 1),  # 86.00 against 85.0 ± 1.0: one spread over, not outside
             ("ours", "b"): Stat(0.70, math.nan, 1, 1),
             ("base", "b"): Stat(0.75, math.nan, 1, 1)}  # the paper's base did not converge here; ours is under it
    text = paper_markdown(Pivot("accuracy", None, ["ours", "base"], ["a", "b"], cells), _paper())
    lines = text.splitlines()
    assert "| ours | a | 89.00 ± 1.00 (2 seeds) | 90.00 ± 0.50 | -1.00 | 2.0 *outside* |" in lines
    assert "| base | a | 86.00 (1 seed) | 85.00 ± 1.00 | +1.00 | 1.0 |" in lines
    assert "| ours | b | 70.00 (1 seed) | 80.00 | -10.00 | (no spread given) |" in lines
    assert "| base | b | 75.00 (1 seed) | - (did not converge) |  |  |" in lines
    assert "3 cells with both numbers, 2 of them with the paper's spread; 1 more than one spread from the paper." \
        in lines
    # claims: a: 89 - 86 = +3 against the paper's +5, margin 3 / hypot(0.5, 1.0); b: ours under base
    assert f"| ours > base | a | +3.00 |  | yes | +5.00 | {3 / math.hypot(0.5, 1.0):+.1f} |" in lines
    assert "| ours > base | b | -5.00 |  | **no** | (the other did not converge) |  |" in lines
    assert "- **ours above every other row**: held in 1, failed in 1" in lines


def test_paper_rows_fedray_has_not_run_are_listed_and_count_as_open():
    cells = {("ours", "a"): Stat(0.91, math.nan, 1, 1)}
    text = paper_markdown(Pivot("accuracy", None, ["ours"], ["a"], cells), _paper())
    assert "| base | a | no finished run | 85.00 ± 1.00 |  |  |" in text.splitlines()
    assert "held in 0, failed in 0, 2 without fedray's numbers (not run or not finished)" in text


def test_claims_alone_on_other_data_weigh_each_gap_by_the_seeds_own_spread():
    cells = {("ours", "a"): Stat(0.80, 0.02, 3, 3), ("base", "a"): Stat(0.79, 0.01, 3, 3),
             ("other", "a"): Stat(0.70, math.nan, 1, 1)}
    paper = parse_paper({"claims": [{"row": "ours", "above": "all"}]}, "paper", ["accuracy"])
    text = paper_markdown(Pivot("accuracy", None, ["ours", "base", "other"], ["a"], cells), paper).splitlines()
    assert "| claim | setting | fedray gap | in fedray's spreads | held |" in text  # no paper columns
    assert f"| ours > base | a | +1.00 | {1 / math.hypot(2, 1):+.1f} | yes |" in text
    assert "| ours > other | a | +10.00 |  | yes |" in text  # one seed: no spread of its own
    with pytest.raises(ConfigError, match=r"paper.cells: expected a mapping .* \(or claims: alone\)"):
        parse_paper({"source": "x"}, "paper", ["accuracy"])


def test_a_paper_label_the_table_does_not_have_is_refused_when_the_sweep_loads(tmp_path, partition_cache):
    def sweep(paper: dict) -> dict:
        return {"base": tiny_base(partition_cache), "axes": {"data.partition.params.alpha": [0.1, 1.0]},
                "table": {"rows": "algorithm.name", "columns": "data.partition.params.alpha", "metric": "accuracy",
                          "paper": paper}}

    good = {"cells": {"fedavg": {"α=0.1": "50 ± 2", "α=1": 60}}, "claims": [{"row": "fedavg", "above": "all"}]}
    spec = load_sweep(data=sweep(good), output_dir=tmp_path / "out")
    assert spec.tables[0].paper["cells"]["fedavg"]["α=1"] == {"mean": 60.0, "std": None}
    with pytest.raises(ConfigError, match=r"paper: column 'alpha=1' is not one of the table's columns \('α=0.1', "
                                          r"'α=1'\)"):
        load_sweep(data=sweep({"cells": {"fedavg": {"alpha=1": 60}}}), output_dir=tmp_path / "out")
    with pytest.raises(ConfigError, match=r"paper: row 'fedprox' is not one of the table's rows \('fedavg'\)"):
        load_sweep(data=sweep({**good, "claims": [{"row": "fedavg", "above": ["fedprox"]}]}),
                   output_dir=tmp_path / "out")


def test_report_sweep_makes_the_paper_table_of_the_runs_kept_in_docs_results(tmp_path, capsys):
    """The FedCCL Table 4 runs committed under docs/results: the sweep file's table of their mean of the last five
    rounds beside the paper's, and its claim (FedCCL above each baseline), seed 0 as written in
    docs/reproductions.md; a run directory that is not a point is named and left out."""
    runs = sorted(str(p) for p in (ROOT / "docs/results/fedccl_table4").iterdir())
    other = str(ROOT / "docs/results/fedpcl_mnist_check/views1-100r-fedpcl-7d7e63554319")
    assert cli(["report", "--sweep", str(ROOT / "jobs/sweeps/fedccl_table4.yaml"), *runs, other,
                "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert f"note: {other}: not a point of fedccl_table4 (another config), left out" in out
    text = (tmp_path / "rep" / "tables" / "accuracy.paper.md").read_text().splitlines()
    assert "| fedccl | source=mnist | 98.16 (1 seed) | 95.15 | +3.01 | (no spread given) |" in text
    assert "| fedccl > fpl | source=fashion-mnist | -0.40 |  | **no** | +5.50 |  |" in text
    assert "- **fedccl above every other row**: held in 9, failed in 1" in text
    assert (tmp_path / "rep" / "tables" / "accuracy.mean_last5.csv").is_file()
    # made again into the folder it reads (docs/results/<sweep>/* with --out docs/results/<sweep>): its own
    # tables.md and tables/ are not taken for runs
    for r in runs:
        if (Path(r) / "config.yaml").is_file():
            (tmp_path / "rep" / Path(r).name).symlink_to(r)
    assert cli(["report", "--sweep", str(ROOT / "jobs/sweeps/fedccl_table4.yaml"),
                *sorted(str(p) for p in (tmp_path / "rep").iterdir()), "--out", str(tmp_path / "rep")]) == 0
    assert "tables" not in "".join(line for line in capsys.readouterr().out.splitlines() if line.startswith("note"))
    assert cli(["report", "--sweep", str(ROOT / "jobs/sweeps/fedccl_table4.yaml"), other,
                "--out", str(tmp_path / "none")]) == 2
    assert "none of the 1 run directories is a finished point of fedccl_table4" in capsys.readouterr().err
    assert cli(["report", "--sweep", str(ROOT / "jobs/sweeps/fedccl_table4.yaml"), *runs, str(tmp_path / "gone"),
                "--out", str(tmp_path / "none")]) == 2
    assert f"{str(tmp_path / 'gone')!r}: no such run directory" in capsys.readouterr().err
