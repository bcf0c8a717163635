"""bench/gpu/fidelity.py's plumbing on the CPU: which points a GPU session still has to run, the data it carries
placed where each point reads it, and the runs that come back unpacked into docs/results without replacing any.
(Its `run --dry` is the CPU check of the whole script: docs/gpu.md.)"""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench" / "gpu"))

import fidelity  # noqa: E402


def _tar(path: Path, files: dict[str, bytes]) -> None:
    with tarfile.open(path, "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_points_on_the_gpu_are_named_apart_and_the_finished_ones_are_skipped(tmp_path):
    cpu = fidelity.load_points(str(ROOT / "jobs/sweeps/scala_fmnist.yaml"), "cpu", [])
    gpu = fidelity.load_points(str(ROOT / "jobs/sweeps/scala_fmnist.yaml"), "cuda", [])
    assert len(cpu.points) == len(gpu.points) == 132
    assert gpu.points[0].config["engine"]["device"] == "cuda" and gpu.points[0].config["engine"]["deterministic"]
    assert gpu.points[0].config["engine"]["backend"] == "local"
    assert {p.run_dir.name for p in cpu.points}.isdisjoint(p.run_dir.name for p in gpu.points)
    assert [p.values["seed"] for p in gpu.points[:44]] == [0] * 44  # seed 0 of every cell first
    done = tmp_path / "scala_fmnist"
    for p, status in ((gpu.points[0], "finished"), (gpu.points[1], "running")):
        (done / p.run_dir.name).mkdir(parents=True)
        (done / p.run_dir.name / "run.json").write_text(json.dumps({"status": status}))
    assert fidelity.finished_names([done]) == {gpu.points[0].run_dir.name}


def test_points_on_the_cpu_keep_the_sweeps_names(tmp_path):
    from fedray.apps.sweep_spec import load_sweep

    sweep = str(ROOT / "jobs/sweeps/scala_fmnist.yaml")
    cpu = fidelity.load_points(sweep, "cpu", [])
    assert [p.run_dir.name for p in cpu.points] == [p.run_dir.name for p in load_sweep(sweep).points]
    assert cpu.points[0].config["engine"]["backend"] == "local"
    assert cpu.points[0].config["output"]["checkpoint_every"] == 0
    with pytest.raises(SystemExit, match="engine.device is cuda"):
        fidelity.load_points(sweep, "cpu", ["engine.device=cuda"])


def test_carried_data_is_linked_where_the_point_reads_it(tmp_path):
    carried = tmp_path / "carried" / "fashion-mnist"
    carried.mkdir(parents=True)
    for f in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz",
              "t10k-labels-idx1-ubyte.gz"):
        (carried / f).write_bytes(b"x")
    root = tmp_path / "machine" / "fashion-mnist"
    spec = fidelity.load_points(str(ROOT / "jobs/sweeps/scala_fmnist.yaml"), "cpu", [f"data.root={root}"])
    fidelity.place_data(spec, carried.parent)
    assert sorted(p.name for p in root.iterdir()) == sorted(p.name for p in carried.iterdir())
    assert all(p.is_symlink() for p in root.iterdir())
    with pytest.raises(SystemExit, match="not carried"):
        fidelity.place_data(fidelity.load_points(str(ROOT / "jobs/sweeps/scala_fmnist.yaml"), "cpu",
                                                 [f"data.root={tmp_path / 'elsewhere'}"]), tmp_path / "empty")


def test_unpack_adds_runs_and_never_replaces_one(tmp_path):
    arch = tmp_path / "fidelity-runs.tar.gz"
    _tar(arch, {"scala_fmnist/scala-aaa/run.json": b'{"status": "finished"}',
                "scala_fmnist/scala-aaa/metrics.jsonl": b"{}\n",
                "scala_fmnist/fedavg-bbb/run.json": b'{"status": "finished"}'})
    into = tmp_path / "results"
    (into / "scala_fmnist" / "fedavg-bbb").mkdir(parents=True)
    (into / "scala_fmnist" / "fedavg-bbb" / "run.json").write_text("kept")
    assert fidelity.main(["unpack", str(arch), "--into", str(into)]) == 0
    assert (into / "scala_fmnist" / "scala-aaa" / "metrics.jsonl").read_text() == "{}\n"
    assert (into / "scala_fmnist" / "fedavg-bbb" / "run.json").read_text() == "kept"
    bad = tmp_path / "bad.tar.gz"
    _tar(bad, {"scala_fmnist/scala-ccc/final_weights.npy": b"0"})
    with pytest.raises(SystemExit, match="unexpected member"):
        fidelity.main(["unpack", str(bad), "--into", str(into)])
    assert not (into / "scala_fmnist" / "scala-ccc").exists()


def test_harvest_adds_a_sweeps_finished_runs_and_never_replaces_one(tmp_path):
    sweep = tmp_path / "sweep"
    for name, status in (("scala-aaa", "finished"), ("fedavg-bbb", "running"), ("fedla-ccc", "finished")):
        run = sweep / "runs" / name
        run.mkdir(parents=True)
        for f in fidelity.SMALL:
            (run / f).write_text(f"{name} {f}")
        (run / "run.json").write_text(json.dumps({"status": status}))  # no owner: a running record stays running
        (run / "final_weights.npy").write_bytes(b"0")
    (sweep / "sweep.json").write_text(json.dumps({"name": "scala_fmnist"}))
    into = tmp_path / "results"
    (into / "scala_fmnist" / "fedla-ccc").mkdir(parents=True)
    (into / "scala_fmnist" / "fedla-ccc" / "summary.json").write_text("kept")
    assert fidelity.main(["harvest", str(sweep), "--into", str(into)]) == 0
    got = into / "scala_fmnist"
    assert sorted(p.name for p in got.iterdir()) == ["fedla-ccc", "scala-aaa"]
    assert sorted(p.name for p in (got / "scala-aaa").iterdir()) == sorted(fidelity.SMALL)  # no weights
    assert (got / "scala-aaa" / "metrics.jsonl").read_text() == "scala-aaa metrics.jsonl"
    assert (got / "fedla-ccc" / "summary.json").read_text() == "kept"
    with pytest.raises(SystemExit, match="not a fedray sweep output directory"):
        fidelity.main(["harvest", str(tmp_path / "results"), "--into", str(into)])
