"""The user's own method (examples/custom-method, copied outside the repository) run end to end: in-process and on
the session's Ray with 1 and 2 workers with the same weights, resumed after a crash with the same weights,
refused on resume after an edit, and stopped before any work when a run's process imports other code."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from fedray.config import ConfigError, load_config
from fedray.core import plugin_loader
from fedray.driver.runner import run_experiment
from fedray.reporting.rundir import RunDir
from tests.helpers import ROOT

EXAMPLE = ROOT / "examples" / "custom-method"


@pytest.fixture
def project(tmp_path):
    """A copy of the example project in a directory of its own (neither the working directory nor sys.path)."""
    dst = tmp_path / "project"
    shutil.copytree(EXAMPLE, dst, ignore=shutil.ignore_patterns("__pycache__", "runs"))
    yield dst
    plugin_loader._forget("mymethod")


def _config(project, root, partition_cache, *overrides):
    return load_config(project / "exp.yaml", ["train.rounds=2", "data.partition.num_clients=8",
                                              "train.clients_per_round=4", f"output.root={root}",
                                              f"data.cache_dir={partition_cache}", "output.tensorboard=false",
                                              *overrides])


def _run(cfg, **kw):
    return run_experiment(cfg, progress=False, log=lambda *a, **k: None, **kw)


@pytest.mark.ray
def test_the_example_gives_the_same_weights_in_process_and_on_ray(project, tmp_path, partition_cache, ray_session):
    local = _run(_config(project, tmp_path / "local", partition_cache, "engine.backend=local", "engine.num_workers=2"))
    runs = [_run(_config(project, tmp_path / f"ray{n}", partition_cache, "engine.backend=ray",
                         f"engine.num_workers={n}")) for n in (1, 2)]
    assert [r.weights_hash for r in runs] == [local.weights_hash] * 2
    assert local.accuracy > 0.1 and local.run_dir.name.startswith("fedavg_logitl2-")
    info = RunDir(runs[1].run_dir).read_json("run.json")
    digest = plugin_loader.digest_files(str(project / "mymethod"))
    assert info["plugins"] == {"mymethod": {"digest": digest, "root": str(project)}}


def test_resume_runs_the_same_code_to_the_same_weights_and_refuses_edited_code(project, tmp_path, partition_cache):
    over = ["engine.backend=local", "train.rounds=4", "output.checkpoint_every=2"]
    clean = _run(_config(project, tmp_path / "clean", partition_cache, *over))
    cfg = _config(project, tmp_path / "crash", partition_cache, *over,
                  "engine.fault_injection={kind: driver_exit, round: 4}")
    (tmp_path / "crash.json").write_text(json.dumps(cfg.to_dict()))
    code = ("import json; from fedray.config import from_dict; from fedray.driver.runner import run_experiment; "
            f"run_experiment(from_dict(json.load(open({str(tmp_path / 'crash.json')!r}))), progress=False)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 17, proc.stderr[-2000:]  # the driver died hard before round 4
    run_dir = next((tmp_path / "crash").iterdir())
    source = project / "mymethod" / "__init__.py"
    original = source.read_text()
    source.write_text(original.replace("logits.pow(2).sum(dim=1).mean()", "logits.pow(2).mean()"))
    with pytest.raises(ConfigError, match=r"plugins\[0\]: the code of 'mymethod' .* is sha256:\w+, but this config "
                                          r"records sha256:\w+: it changed since the run"):
        _run(None, resume=run_dir)
    source.write_text(original)
    assert _run(None, resume=run_dir).weights_hash == clean.weights_hash


@pytest.mark.ray
def test_a_process_that_imports_other_code_stops_the_run_before_any_work(project, tmp_path, partition_cache,
                                                                         ray_session):
    """The config was resolved (hashed) before the code changed: the coordinator imports the edited files, finds
    another digest and the run fails naming the node, before the run directory is claimed."""
    cfg = _config(project, tmp_path / "runs", partition_cache, "engine.backend=ray", "engine.num_workers=1")
    with (project / "mymethod" / "__init__.py").open("a") as f:
        f.write("\n# edited after the config was read\n")
    with pytest.raises(ConfigError, match=r"plugins\[0\]: node \S+ imported 'mymethod' from .* with digest sha256:\w+, "
                                          r"but the run's driver hashed"):
        _run(cfg)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").glob("fedavg_logitl2-*"))


WRAPPER = """
import sys
sys.path.insert(0, sys.argv[1])
import mymethod  # a script that imports its method, then calls fedray, without naming it in plugins:
from fedray.cli import main
sys.exit(main(["run", sys.argv[2], "plugins=[]", "engine.backend=ray", "engine.num_workers=1", "train.rounds=1",
               f"output.root={sys.argv[3]}", "--quiet"]))
"""


@pytest.mark.ray
def test_a_method_imported_by_the_driver_only_gets_a_hint(project, tmp_path, ray_session):
    import os

    env = {**os.environ, "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}
    r = subprocess.run([sys.executable, "-c", WRAPPER, str(project), str(project / "exp.yaml"), str(tmp_path / "runs")],
                       capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
    assert "algorithm.name: unknown algorithm 'fedavg_logitl2'" in r.stderr
    assert ("hint: algorithm 'fedavg_logitl2' is registered in this process by module mymethod, which the run's "
            "actors do not import: add `plugins: [mymethod]` to the config") in r.stderr
