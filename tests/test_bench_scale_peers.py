"""bench/bench_scale_peers.py's plumbing (issue 30 item 5): the P:K points, the scale file's geometry as the peers
read it, the scale-P-K-R workloads of bench/workload_def.py and their data, and which peer runs at which point.
Neither pfl nor Flower is needed; the one test that runs pfl-research skips when bench/.pfl-venv is missing."""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import bench_scale_peers as bsp  # noqa: E402
import bench_scale_rounds  # noqa: E402
import bench_workload  # noqa: E402
import workload_def as wd  # noqa: E402


def test_points_parse_in_order_with_the_big_ones_on_request():
    assert bsp.parse_points(bsp.DEFAULT_POINTS) == [(1000, 100), (10000, 100), (100000, 100)]
    assert bsp.parse_points("10_000:10, 1000:100,1000:100", with_1m=True, with_10m=True) == [
        (10000, 10), (1000, 100), (1_000_000, 100), (10_000_000, 100)]
    assert bsp.parse_points("1000000:100", with_1m=True) == [(1_000_000, 100)]  # not twice


@pytest.mark.parametrize("bad", ["1000", "1000:", "a:10", "100:1000", "0:0", "1000:100:3", "", "1,000:100"])
def test_malformed_points_are_refused(bad):
    with pytest.raises(ValueError):
        bsp.parse_points(bad)


def test_scale_file_geometry_is_what_the_peers_do(tmp_path, monkeypatch):
    setup = bsp.scale_setup()
    assert setup["rounds"] == 3
    assert "num_clients" not in setup["params"]  # P comes from the point
    assert setup["params"]["dimension"] == wd.SCALE_DIMENSION == 8
    assert (setup["params"]["min_samples"], setup["params"]["max_samples_per_client"]) == (4, 4)
    # a scale file the peers do not implement is refused, not run with another geometry
    text = (ROOT / bsp.CONFIG).read_text().replace("hidden: [64]", "hidden: [32]").replace("lr: 0.05", "lr: 0.1")
    (tmp_path / "jobs" / "configs").mkdir(parents=True)
    (tmp_path / bsp.CONFIG).write_text(text)
    monkeypatch.setattr(bsp, "ROOT", tmp_path)
    with pytest.raises(ValueError, match="model.params.hidden.*train.lr"):
        bsp.scale_setup()


def test_fedray_runs_the_one_point_of_the_scale_file(tmp_path):
    import yaml

    spec = yaml.safe_load(Path(bench_scale_rounds.restrict(bsp.CONFIG, "10000:100", tmp_path, None)).read_text())
    assert spec["sweeps"] == [{"population": [10000], "clients_per_round": [100]}]
    assert spec["rounds"] == 3 and spec["experiment"]["model"]["params"]["hidden"] == [64]


def test_scale_workload_names():
    name = wd.scale_name(100000, 100, 3)
    assert name == "scale-100000-100-3"
    assert wd.WORKLOADS[name] == wd.Workload(100000, 100, 3, "scale")
    assert wd.workload_name(name) == name and wd.workload_name("W1") == "W1"
    for bad in ("scale-100-1000-3", "scale-1000-100", "scale-x-1-1", "W9"):
        with pytest.raises(argparse.ArgumentTypeError):
            wd.workload_name(bad)
    _, args = wd.model_spec(name)
    assert args == (8, 64, 10)


def test_peers_per_point_flower_only_up_to_its_limit():
    cmds = bsp.peer_commands((100000, 100), 3, "/d.npz", "pfl-py", "flower-py", 100000)
    assert sorted(cmds) == ["flower-2a", "pfl-1t"]
    assert cmds["pfl-1t"][-4:] == ["--threads", "1", "--data", "/d.npz"]
    assert "scale-100000-100-3" in cmds["flower-2a"]
    assert list(bsp.peer_commands((1_000_000, 100), 3, "/d.npz", "pfl-py", "flower-py", 100000)) == ["pfl-1t"]
    assert bsp.peer_commands((1000, 100), 3, "/d.npz", None, None, 100000) == {}
    assert bsp.peer_updates_per_s({"round_s": [9.0, 0.5, 1.5]}, 100) == pytest.approx(100.0)  # rounds 2..R


def test_table_has_ratios_and_leaves_failures_out():
    res = {"1000:100": {"fedray-2w": {"updates_per_s": 800.0}, "pfl-1t": {"updates_per_s": 400.0}},
           "10000:100": {"fedray-2w": {"updates_per_s": 1000.0}}}
    t = bsp.table([(1000, 100), (10000, 100)], res).splitlines()
    assert t[0] == "| P | K | fedray upd/s | pfl-1t upd/s | pfl-1t / fedray |"
    assert t[2] == "| 1,000 | 100 | 800.0 | 400.0 | 0.50 |"
    assert t[3] == "| 10,000 | 100 | 1,000.0 | - | - |"


@pytest.fixture(scope="module")
def scale_data(tmp_path_factory):
    path = tmp_path_factory.mktemp("scale") / "data-P1000.npz"
    bsp.export_point(bsp.scale_setup()["params"], 1000, path)
    return str(path)


def test_scale_data_is_3_train_rows_a_client(scale_data):
    X_train, X_test, y_train, _, rows = wd.load("scale-1000-100-3", scale_data)
    assert X_train.shape == (3000, 8) and X_train.dtype == np.float32 and X_test.shape[1] == 8
    assert len(rows) == 1000 and all(len(rows[k]) == 3 for k in (0, 1, 999))
    assert list(rows[1]) == [3, 4, 5]
    with np.load(scale_data) as z:
        assert (z["c_tr"][rows[7]] == 7).all()
    assert len(wd.sampled_clients("scale-1000-100-3", 2, rows)) == 100
    with pytest.raises(IndexError):
        rows[1000]


def test_client_rows_of_unsorted_clients():
    rows = wd.ClientRows(np.array([2, 0, 2, 1, 0]), 4)
    assert [list(rows[k]) for k in range(4)] == [[1, 4], [3], [0, 2], []]


@pytest.mark.skipif(not bench_workload.pfl_venv_ready(), reason="bench/.pfl-venv missing (`fedray bench workload --pfl`)")
def test_pfl_runs_a_scale_point(scale_data):
    out = subprocess.run([str(bench_workload.PFL_VENV / "bin" / "python"), str(ROOT / "bench" / "workload_pfl.py"),
                          "--workload", "scale-1000-100-3", "--data", scale_data], capture_output=True, text=True,
                         check=True, timeout=600)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert len(r["round_s"]) == 3 and r["workload"] == "scale-1000-100-3"
    assert len(r["round_cpu_s"]) == 3 and all(c > 0 for c in r["round_cpu_s"])


def test_table_adds_updates_per_cpu_second_where_measured():
    res = {"1000:100": {"fedray-2w": {"updates_per_s": 800.0, "updates_per_cpu_s": 1000.0},
                        "pfl-1t": {"updates_per_s": 400.0, "updates_per_cpu_s": 500.0},
                        "flower-2a": {"updates_per_s": 40.0}}}
    t = bsp.table([(1000, 100)], res).splitlines()
    assert t[0].endswith("| fedray upd/CPU-s | pfl-1t upd/CPU-s | pfl-1t / fedray (CPU) |")
    assert t[2].endswith("| 1,000.0 | 500.0 | 0.50 |")
    r = {"round_s": [9.0, 1.0, 1.0], "round_cpu_s": [5.0, 0.5, 1.5]}
    assert bsp.peer_updates_per_s(r, 100) == 100.0 and bsp.peer_updates_per_s(r, 100, "round_cpu_s") == 100.0
    assert math.isnan(bsp.peer_updates_per_s({"round_s": [1.0, 1.0]}, 100, "round_cpu_s"))
