"""The ``fedray`` command line: overrides anywhere on the line, ``python -m fedray``, ``run --dry-run`` and
``fedray show`` (tiny local-backend runs of the demo config)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from fedray.cli import main
from fedray.config import load_config
from fedray.driver.runner import run_experiment
from fedray.reporting.rundir import RunDir
from tests.helpers import ROOT, small_config

DEMO = str(ROOT / "jobs" / "configs" / "demo.yaml")


def _tiny(tmp_path, partition_cache, *extra: str) -> list[str]:
    """Overrides that make the demo a one-round, 10-client local run writing under tmp_path."""
    return ["engine.backend=local", "train.rounds=1", "data.partition.num_clients=10", "train.clients_per_round=2",
            "eval.every=1", f"output.root={tmp_path / 'runs'}", f"data.cache_dir={partition_cache}",
            "output.tensorboard=false", *extra]


def _run_dir(out: str):

    return Path(next(line for line in out.splitlines() if line.startswith("run directory:")).split(": ", 1)[1])


# ----------------------------------------------------------------------------------- argument order
def test_overrides_may_follow_options_and_options_may_follow_overrides(tmp_path, capsys):
    # `--output-dir X a.b=c`: plain argparse rejects an override after an option
    assert main(["run", DEMO, "--output-dir", str(tmp_path / "x"), "train.rounds=3", "--dry-run", "eval.every=2",
                 "train.lr=0.01"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out.split("run directory:")[0])
    assert cfg["train"]["rounds"] == 3 and cfg["eval"]["every"] == 2 and cfg["train"]["lr"] == 0.01
    assert cfg["output"]["root"] == str(tmp_path / "x")
    # `a.b=c --quiet` and the config after an option
    assert main(["run", "--dry-run", DEMO, "train.rounds=4", "--quiet"]) == 0
    assert yaml.safe_load(capsys.readouterr().out.split("run directory:")[0])["train"]["rounds"] == 4
    assert not (tmp_path / "x").exists()


def test_partition_takes_overrides_after_options(tmp_path, capsys):
    cfg = tmp_path / "p.yaml"
    cfg.write_text("data: {source: mnist5k, partition: {name: iid, num_clients: 30}}\n")
    assert main(["partition", str(cfg), "--output-dir", str(tmp_path / "parts"), "data.partition.num_clients=12",
                 "--clients", "3", "train.clients_per_round=2"]) == 0
    assert "... 9 more clients" in capsys.readouterr().out
    table = next((tmp_path / "parts").glob("*/clients.csv")).read_text().splitlines()
    assert len(table) == 13  # header + the 12 clients of the override, not the file's 30


def test_unknown_option_is_still_an_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(["run", DEMO, "--no-such-option", "train.rounds=1"])
    assert e.value.code == 2
    assert "--no-such-option" in capsys.readouterr().err


# ----------------------------------------------------------------------------------- python -m fedray
def test_python_m_fedray_runs_the_cli_and_propagates_the_exit_status(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    ok = subprocess.run([sys.executable, "-m", "fedray", "run", DEMO, "--dry-run", "train.rounds=2"],
                        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert yaml.safe_load(ok.stdout.split("run directory:")[0])["train"]["rounds"] == 2
    bad = subprocess.run([sys.executable, "-m", "fedray", "show", str(tmp_path)], capture_output=True, text=True,
                         cwd=tmp_path, env=env, timeout=120)
    assert bad.returncode == 2
    assert "run.json is missing" in bad.stderr
    assert not (tmp_path / "runs").exists()


# ----------------------------------------------------------------------------------- run --dry-run
def test_dry_run_prints_the_config_yaml_and_run_directory_of_the_real_run(tmp_path, partition_cache, capsys):
    args = ["run", DEMO, *_tiny(tmp_path, partition_cache)]
    assert main([*args, "--dry-run"]) == 0
    dry = capsys.readouterr().out
    assert not (tmp_path / "runs").exists(), "--dry-run wrote something"
    assert main([*args, "--quiet"]) == 0
    run_dir = _run_dir(capsys.readouterr().out)
    assert _run_dir(dry) == run_dir
    assert dry.split("run directory:")[0] == (run_dir / "config.yaml").read_text()


@pytest.mark.parametrize("bad, message", [
    (["train.rounds=0"], "train.rounds"),
    (["algorithm.name=no_such_algorithm"], "unknown algorithm 'no_such_algorithm'"),
    (["model.name=no_such_model"], "unknown model 'no_such_model'"),
])
def test_dry_run_of_an_invalid_config_is_the_usual_error(tmp_path, capsys, bad, message):
    assert main(["run", DEMO, "--dry-run", f"output.root={tmp_path / 'runs'}", *bad]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedray run: error:") and message in err
    assert not (tmp_path / "runs").exists()


def test_dry_run_refuses_resume(tmp_path, capsys):
    assert main(["run", "--dry-run", "--resume", str(tmp_path)]) == 2
    assert "--dry-run needs a CONFIG" in capsys.readouterr().err


# ----------------------------------------------------------------------------------- show
def _show(capsys, run_dir) -> dict:
    assert main(["show", str(run_dir)]) == 0
    out = capsys.readouterr().out
    return {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in out.splitlines())}


def test_show_a_stopped_run_names_the_resume_command_and_a_finished_one_does_not(tmp_path, partition_cache, capsys):

    cfg = load_config(DEMO, _tiny(tmp_path, partition_cache, "train.rounds=3", "output.checkpoint_every=1"))
    stopped = run_experiment(cfg, progress=False, log=lambda *a: None, on_round=lambda report: report["round"] >= 2)
    run_dir = stopped.run_dir
    shown = _show(capsys, run_dir)
    assert shown["status"] == "stopped"
    assert (shown["algorithm"], shown["model"], shown["source"]) == ("fedavg", "fedavg_cnn", "mnist5k")
    assert shown["device"] == "cpu"
    assert shown["rounds"] == "2 / 3"
    assert shown["last checkpoint"] == "round 2 (ckpt-000002.npz)"
    assert shown["resume"] == f"fedray run --resume {run_dir}"

    # the printed command really continues the run
    assert main(shown["resume"].split()[1:] + ["--quiet"]) == 0
    capsys.readouterr()
    shown = _show(capsys, run_dir)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    best = max(rows, key=lambda r: r["accuracy"])
    assert shown["status"] == "finished" and shown["rounds"] == "3 / 3" and "resume" not in shown
    assert shown["accuracy"] == f"{rows[-1]['accuracy']:.4f} (last), {rows[-1]['ema_accuracy']:.4f} (EMA)"
    assert shown["best accuracy"] == f"{best['accuracy']:.4f} at round {best['round']}"
    assert shown["last checkpoint"] == "round 3 (ckpt-000003.npz)"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert shown["finished in"].endswith(f"weights {summary['weights_hash']}")


def test_show_of_a_directory_that_is_not_a_run_names_the_missing_file(tmp_path, capsys):
    assert main(["show", str(tmp_path / "absent")]) == 2
    assert "no such directory" in capsys.readouterr().err
    assert main(["show", str(tmp_path)]) == 2
    assert "run.json is missing" in capsys.readouterr().err
    (tmp_path / "run.json").write_text(json.dumps({"status": "running"}))
    assert main(["show", str(tmp_path)]) == 2
    assert "config.yaml is missing" in capsys.readouterr().err


def test_cli_bench_lists_and_refuses_unknown(capsys):
    from fedray.cli import bench_scripts, main

    assert {"workload", "partition", "finch", "fedrcl_loss", "split", "aggregate"} <= set(bench_scripts())
    assert main(["bench"]) == 0
    assert "workload" in capsys.readouterr().out
    assert main(["bench", "no-such"]) == 2
    assert "unknown benchmark 'no-such'" in capsys.readouterr().err


def test_cli_partition_prints_per_client_statistics_and_datasets_lists_everything(tmp_path, partition_cache, capsys):
    from fedray.cli import main

    cfg = tmp_path / "p.yaml"
    cfg.write_text("data: {source: mnist5k, partition: {name: classes_per_client, num_clients: 30, "
                   "params: {classes: 2}}}\n")
    assert main(["partition", str(cfg), "--output-dir", str(tmp_path / "parts"), "--clients", "5"]) == 0
    out = capsys.readouterr().out
    assert "largest classes" in out and "... 25 more clients" in out
    table = next((tmp_path / "parts").glob("*/clients.csv")).read_text().splitlines()
    assert table[0].startswith("client,samples,classes,entropy") and len(table) == 31
    assert all(int(line.split(",")[2]) <= 2 for line in table[1:])  # classes per client never exceed 2
    assert main(["datasets"]) == 0
    listing = capsys.readouterr().out
    for name in ("mnist5k", "balanced_dirichlet", "resnet18_gn", "fedrcl", "fedacg", "balanced_accuracy", "ece"):
        line = next(ln for ln in listing.splitlines() if ln.strip().startswith(name + " ") or ln.strip() == name)
        assert len(line.split()) > 1, f"{name} is listed without a description"


def test_cli_partition_plot_writes_the_heat_map_next_to_clients_csv(tmp_path, capsys):
    cfg = tmp_path / "p.yaml"
    cfg.write_text("data: {source: mnist5k, partition: {name: dirichlet, num_clients: 30, params: {alpha: 0.1}}}\n")
    assert main(["partition", str(cfg), "--output-dir", str(tmp_path / "parts"), "--plot",
                 "data.partition.num_clients=10", "train.clients_per_round=2"]) == 0
    out = capsys.readouterr().out
    table = next((tmp_path / "parts").glob("*/clients.csv"))
    heat = table.parent / "label_heatmap.png"
    assert f"label distribution heat map: {heat}" in out
    assert heat.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["partition", str(cfg), "--output-dir", str(tmp_path / "other"), "data.partition.num_clients=10",
                 "train.clients_per_round=2"]) == 0
    assert "heat map" not in capsys.readouterr().out and not list((tmp_path / "other").glob("*/label_heatmap.png"))


# ------------------------------------------------------------------------------------ CLI
def test_cli_run_and_report(tmp_path, partition_cache):
    from fedray.cli import main

    cfg = small_config(tmp_path, partition_cache, train__rounds=2)
    import yaml

    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["run", str(path), "train.clients_per_round=4", "-q"]) == 0
    run_dir = next((tmp_path / "runs").iterdir())
    rows = RunDir(run_dir).read_metrics()
    assert len(rows) == 2 and rows[0]["num_clients"] == 4
    assert main(["report", str(run_dir), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "accuracy.png").stat().st_size > 1000
    assert "accuracy" in (tmp_path / "rep" / "summary.md").read_text()
    assert main(["run", str(path), "train.rounds=zero"]) == 2
