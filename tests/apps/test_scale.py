"""fedray.apps.scale: the scaling sweep, its table, resume and file errors."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from fedray.config import ConfigError
from tests.helpers import synthetic_experiment as _synthetic_experiment


# ------------------------------------------------------------------------------------ scaling table
def test_scaling_table_has_the_documented_columns(tmp_path, partition_cache):
    from fedray.apps.scale import COLUMNS, load_scale, run_scale

    spec = load_scale(data={
        "name": "tiny", "rounds": 2, "output": str(tmp_path / "out"),
        "experiment": _synthetic_experiment(tmp_path, partition_cache),
        "defaults": {"population": 40, "clients_per_round": 5, "num_workers": 1},
        "sweeps": [{"clients_per_round": [5, 20], "multi_client": [1, 4]}, {"population": [10, 60]},
                   {"clients_per_round": [50], "population": [40]}],  # more clients per round than clients: skipped
    })
    rows, files = run_scale(spec, log=lambda *a: None)
    table = pq.read_table(tmp_path / "out" / "scaling.parquet")
    assert table.column_names == list(COLUMNS)
    assert table.num_rows == len(spec.points) == 7
    by = {(r["population"], r["clients_per_round"], r["multi_client"]): r for r in table.to_pylist()}
    assert by[(40, 50, 1)]["status"].startswith("skipped")
    ok = [r for r in table.to_pylist() if r["status"] == "ok"]
    assert len(ok) == 6
    for r in ok:
        assert r["client_updates"] == r["clients_per_round"]  # round 2 only (round 1 is the warm-up)
        assert r["client_updates_per_s"] > 0 and r["samples_per_s"] > 0 and r["round_s"] > 0
        assert r["coordinator_peak_mb"] > 0 and r["num_params"] == 60 * 16 + 16 + 16 * 10 + 10
        assert r["backend"] == "local" and r["source"] == "synthetic"
    # multi-client changes float rounding only
    assert by[(40, 20, 4)]["accuracy"] == pytest.approx(by[(40, 20, 1)]["accuracy"], abs=0.02)
    names = {f.name for f in files}
    assert {"scaling.parquet", "scaling.csv", "scaling.md", "throughput_vs_clients_per_round.png",
            "memory_vs_population.png", "latency_vs_population.png"} <= names


def test_scale_resume_keeps_finished_points(tmp_path, partition_cache):
    """A sweep stopped after its first point (the table is rewritten after every point) resumes with
    ``resume=True``: the finished point is kept as measured, only the rest runs; a changed experiment is refused."""
    import pyarrow.parquet as pq

    from fedray.apps.scale import load_scale, run_scale

    data = {"name": "tiny", "rounds": 2, "output": str(tmp_path / "out"),
            "experiment": _synthetic_experiment(tmp_path, partition_cache),
            "defaults": {"population": 40, "num_workers": 1}, "sweep": {"clients_per_round": [5, 10, 20]}}
    rows, _ = run_scale(load_scale(data=data), log=lambda *a: None)
    table = tmp_path / "out" / "scaling.parquet"
    pq.write_table(pq.read_table(table).slice(0, 1), str(table))  # as if stopped during point 2
    logs: list[str] = []
    again, _ = run_scale(load_scale(data=data), log=logs.append, resume=True)
    assert [r["status"] for r in again] == ["ok"] * 3
    assert "kept" in logs[0] and not any("kept" in m for m in logs[1:])
    assert again[0]["total_s"] == rows[0]["total_s"]  # the same measurement, not a new one
    assert [r["weights_hash"] for r in again] == [r["weights_hash"] for r in rows]
    changed = {**data, "experiment": {**data["experiment"], "seed": 1}}
    with pytest.raises(ConfigError, match=r"--resume: experiment differs"):
        run_scale(load_scale(data=changed), log=lambda *a: None, resume=True)


def test_scale_file_errors_name_the_field(tmp_path, partition_cache):
    from fedray.apps.scale import load_scale

    exp = _synthetic_experiment(tmp_path, partition_cache)
    for bad, field in [({"sweep": {"clients": [1]}}, r"^sweep\.clients"),
                       ({"sweeps": [{"population": [0]}]}, r"^sweeps\[0\]\.population"),
                       ({"rounds": 0}, r"^rounds"), ({"defaults": {"num_workers": [1, 2]}}, r"^defaults\.num_workers"),
                       ({"colour": 1}, r"^colour"), ({"experiment": None, "base": "missing.yaml"}, r"^base")]:
        with pytest.raises(ConfigError, match=field):
            load_scale(data={"experiment": exp, **bad})


def test_fold_group_axis_divides_the_upload(tmp_path, partition_cache):
    """``fold_group`` is an axis: the workers send one partial sum per g clients, so ``upload_mb`` falls by g
    exactly; a fold_group that is not a multiple of multi_client is skipped, with the reason."""
    from fedray.apps.scale import load_scale, run_scale

    spec = load_scale(data={
        "name": "groups", "rounds": 2, "output": str(tmp_path / "out"),
        "experiment": _synthetic_experiment(tmp_path, partition_cache),
        "defaults": {"population": 60, "clients_per_round": 20, "num_workers": 2},
        "sweeps": [{"fold_group": [1, 5]}, {"fold_group": [5], "multi_client": [2]}],
    })
    rows, _ = run_scale(spec, log=lambda *a: None)
    by = {(r["fold_group"], r["multi_client"]): r for r in pq.read_table(tmp_path / "out" / "scaling.parquet").to_pylist()}
    assert by[(1, 1)]["status"] == by[(5, 1)]["status"] == "ok"
    per_update = by[(1, 1)]["num_params"] * 4 / 1e6
    assert by[(1, 1)]["upload_mb"] == pytest.approx(20 * per_update, rel=1e-12)
    assert by[(5, 1)]["upload_mb"] == pytest.approx(4 * per_update, rel=1e-12)
    assert by[(5, 2)]["status"] == "skipped: fold_group 5 is not a multiple of multi_client 2"
    assert "-g5" in {p.name[-3:] for p in (tmp_path / "out" / "runs").iterdir()}


def test_fold_group_axis_refused_for_an_algorithm_that_cannot_fold_groups(tmp_path, partition_cache):
    from fedray.apps.scale import load_scale

    exp = _synthetic_experiment(tmp_path, partition_cache, algorithm={"name": "moon", "params": {}})
    with pytest.raises(ConfigError, match=r"^fold_group: a point has fold_group 4, but engine.fold_group: 4"):
        load_scale(data={"experiment": exp, "sweep": {"fold_group": [1, 4]}})


@pytest.mark.parametrize("name", ["scale_100k.yaml", "scale_full.yaml", "scale_fold_group.yaml", "scale_10m.yaml",
                                  "scale_10k.yaml", "scale_curves.yaml"])
def test_shipped_scale_files_are_valid(name):
    from pathlib import Path

    from fedray.apps.scale import load_scale

    spec = load_scale(Path(__file__).resolve().parents[2] / "jobs" / "configs" / name)
    assert spec.points and spec.rounds >= 1


def test_scale_command_line_takes_overrides_and_dry_run(tmp_path, partition_cache, capsys):
    """`fedray scale` has the shape of every batch command: a.b=c overrides of the base experiment anywhere on the
    line (after the file's own), --dry-run lists the points and writes nothing."""
    import yaml

    from fedray.apps.scale import load_scale
    from fedray.cli import main as cli

    path = tmp_path / "scale.yaml"
    path.write_text(yaml.safe_dump({"name": "tiny", "rounds": 2, "output": str(tmp_path / "out"),
                                    "experiment": _synthetic_experiment(tmp_path, partition_cache),
                                    "overrides": ["train.lr=0.2"], "sweep": {"clients_per_round": [5, 10]}}))
    spec = load_scale(path, overrides=["train.lr=0.01", "seed=4"])
    assert spec.base["train"]["lr"] == 0.01 and spec.base["seed"] == 4
    assert cli(["scale", "--dry-run", str(path), "train.lr=0.01", "--output-dir", str(tmp_path / "o2")]) == 0
    text = capsys.readouterr().out
    assert "2 points x 2 rounds -> " + str(tmp_path / "o2") in text and not (tmp_path / "o2").exists()
    assert cli(["scale", str(path), "train.lrr=1", "--dry-run"]) == 2
    assert "fedray scale: error: train.lrr" in capsys.readouterr().err
