"""fedray.apps.sweep / sweep_spec: sweep files checked before any work (errors name the field, exit 2, nothing
written), the points and their run directories (the names `fedray run` gives), dry run, refusal of an existing
sweep, a failing point reported after the others finished. Runs here use the local backend (one at a time);
the kill + resume on Ray is in tests/integration/test_sweep.py."""

from __future__ import annotations

import json
import math

import pyarrow.parquet as pq
import pytest

from fedray.apps.sweep_spec import load_sweep
from fedray.cli import main as cli
from fedray.config import ConfigError, load_config
from fedray.reporting.claim import default_run_name
from tests.apps.sweeps import write_sweep


def _exit_and_message(capsys, args) -> tuple[int, str]:
    rc = cli(args)
    return rc, capsys.readouterr().err


@pytest.mark.parametrize("over, message", [
    ({"axes": {"algorithm.nmae": ["fedavg"]}}, r"axes\.algorithm\.nmae: unknown config field \(algorithm has no field "
                                              r"'nmae'"),
    ({"axes": {"train.lr": [0.1, -1.0]}}, r"point 1 \(train\.lr=-1\.0\): train\.lr"),
    ({"axes": {"seed": []}}, r"axes\.seed: the list of values is empty"),
    ({"axes": {"algorithm.params.mu": [0.1]}}, r"point 0 \(algorithm\.params\.mu=0\.1\): algorithm\.params"),
    ({"axes": {"seed": [0, 0]}}, r"points 0 \(seed=0\) and 1 \(seed=0\) are the same run"),
    ({"axes": {"engine.num_workers": [1, 2]}}, r"are the same run"),  # not hashed: one run directory
    ({"zip": {"seed": [0, 1], "train.lr": [0.1]}}, r"zip: .*same length; got seed: 2, train\.lr: 1"),
    ({"zip": {"algorithm.params": [{}]}, "axes": {"algorithm.params.mu": [0.1]}}, r"overlaps zip\.algorithm\.params"),
    ({"exclude": [{"seed": 7}]}, r"exclude\[0\]: \{'seed': 7\} matches no point"),
    ({"exclude": [{"train.lr": 0.1}]}, r"exclude\[0\]\.train\.lr: not a field of axes"),
    ({"table": {"rows": "algorithm.name"}}, r"table 'table': points 0 .* and 2 .* would share the cell .* differ in "
                                            r"data\.partition\.params\.alpha"),
    ({"table": {"rows": "algorithm.name", "columns": "seed"}}, r"table\.columns: seed cannot label"),
    ({"table": {"rows": "algorithm.name", "metric": "median:loss"}}, r"table\.metric: 'median:loss'"),
    ({"table": {"rows": "algorithm.name", "columns": "data.partition.params.alpha", "metric": "balanced_accuracy"}},
     r"table 'table': metric 'balanced_accuracy' is not a table metric and not in eval\.metrics of point 0 "
     r"\(data\.partition\.params\.alpha=0\.1, seed=0\)"),
    ({"resources": {"workers": 0}}, r"resources\.workers: expected an integer >= 1"),
    ({"paralel": 2}, r"paralel: unknown field in the sweep file"),
    ({"base": "missing.yaml"}, r"base: experiment config .*missing\.yaml' does not exist"),
    ({"overrides": ["seed=3"]}, r"override 'seed=3': seed varies in the sweep"),
])
def test_bad_sweep_files_exit_2_naming_the_field_and_write_nothing(tmp_path, partition_cache, capsys, over, message):
    out = tmp_path / "out"
    path = write_sweep(tmp_path, partition_cache, **over)
    rc, err = _exit_and_message(capsys, ["sweep", str(path), "--output-dir", str(out)])
    assert rc == 2, err
    import re

    assert re.search(message, err), err
    assert not out.exists()


def test_points_are_ordinary_runs_named_as_fedray_run_names_them(tmp_path, partition_cache, capsys):
    path = write_sweep(tmp_path, partition_cache,
                       zip={"algorithm.name": ["fedavg", "fedprox"], "algorithm.params": [{}, {"mu": 0.01}]},
                       exclude=[{"algorithm.name": "fedprox", "seed": 1}])
    spec = load_sweep(path, overrides=["train.rounds=2"], output_dir=tmp_path / "out")
    assert len(spec.points) == 2 * 2 * 2 - 2 and spec.fields[:2] == ["algorithm.name", "algorithm.params"]
    assert [p.values for p in spec.points][-1] == {"algorithm.name": "fedprox", "algorithm.params": {"mu": 0.01},
                                                   "data.partition.params.alpha": 1.0, "seed": 0}
    for p in spec.points:  # the run directory `fedray run base.yaml <the point's values> train.rounds=2` uses
        ovs = ["train.rounds=2", *(f"{k}={json.dumps(v)}" for k, v in p.values.items())]
        cfg = load_config(tmp_path / "base.yaml", ovs)
        assert p.run_dir == tmp_path / "out" / "runs" / default_run_name(cfg) and p.rounds == 2
    rc = cli(["sweep", str(path), "--output-dir", str(tmp_path / "out"), "--dry-run", "train.rounds=2"])
    text = capsys.readouterr().out
    assert rc == 0 and "6 points" in text and str(spec.points[5].run_dir) in text
    assert not (tmp_path / "out").exists()


def test_a_failing_point_is_named_after_the_others_finish(tmp_path, partition_cache, capsys):
    """Point 1's clients raise in round 1 (engine.fault_injection, no retries): exit 1 naming it; point 0 is in
    sweep.parquet and the tables; an existing sweep directory is refused without --resume."""
    path = write_sweep(tmp_path, partition_cache, axes=None, parallel=None,
                       zip={"seed": [0, 1], "engine.fault_injection": [{}, {"kind": "raise", "round": 1, "client": 0,
                                                                            "times": 9}]},
                       table={"rows": "algorithm.name", "metric": "accuracy"})
    out = tmp_path / "out"
    args = ["sweep", str(path), "engine.backend=local", "train.rounds=1", "train.clients_per_round=8",
            "engine.max_client_retries=0", "--output-dir", str(out)]
    rc = cli(args)
    err = capsys.readouterr().err
    assert rc == 1 and "1 point(s) failed: point 1 (seed=1, engine.fault_injection=" in err
    assert "injected fault in round 1, client 0" in err
    rows = pq.read_table(out / "sweep.parquet").to_pylist()
    assert [r["status"] for r in rows] == ["finished", "failed"]
    assert rows[0]["rounds"] == 1 and not math.isnan(rows[0]["accuracy"]) and rows[1]["error"]
    assert "point 1 (seed=1" in (out / "tables.md").read_text()  # left out, with a note
    assert json.loads((out / "runs" / rows[1]["run_dir"].rsplit("/", 1)[-1] / "run.json").read_text())["status"] \
        == "failed"
    with pytest.raises(ConfigError, match="already holds a sweep; continue it with --resume"):
        from fedray.apps.sweep import run_sweep

        run_sweep(load_sweep(path, overrides=args[2:6], output_dir=out))


def test_a_crashed_sweep_session_records_why(tmp_path, partition_cache, monkeypatch):
    """A session that leaves its points by an exception is recorded ``crashed`` with the reason in sweep.json, as a
    study's is (fedray.core.owner.crash_reason; before, ``crashed`` and no reason)."""
    import fedray.apps.sweep as sweep_mod

    def boom(*args, **kwargs):
        raise RuntimeError("boom\nmore")

    monkeypatch.setattr(sweep_mod, "_run_points", boom)
    path = write_sweep(tmp_path, partition_cache)
    with pytest.raises(RuntimeError, match="boom"):
        sweep_mod.run_sweep(load_sweep(path, overrides=["train.rounds=1", "engine.backend=local"],
                                       output_dir=tmp_path / "out"), log=print)
    last = json.loads((tmp_path / "out" / "sweep.json").read_text())["sessions"][-1]
    assert last["status"] == "crashed" and last["reason"] == "RuntimeError: boom"
