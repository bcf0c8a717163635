"""The Python API for notebooks (fedray/api.py, docs/python-api.md): ``fedray.run`` gives the bits and the run
directory of ``fedray run``, its result as a table and arrays, the same object ``fedray.load_run`` reads back; a
finished run is read back, not run again; in-memory data runs in-process and on Ray with the same bits; bad input
and ``__main__`` code on Ray fail before any work; ``fedray.sweep`` / ``fedray.tune`` return their tables; the
example notebook runs."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import yaml

import fedray
from fedray.config import ConfigError
from fedray.core import plugin_loader
from tests.helpers import ROOT, small_config

EXAMPLE = ROOT / "examples" / "custom-method"
QUIET_ENV = {**os.environ, "TQDM_DISABLE": "1", "RAY_USAGE_STATS_ENABLED": "0", "FEDRAY_NO_WARM": "1"}


def _tiny(tmp_path, partition_cache, **over) -> dict:
    """Two rounds of FedAvg with a small MLP on 10 clients of the embedded MNIST subset (about a second)."""
    return small_config(tmp_path, partition_cache, model={"name": "mlp", "params": {"hidden": [16]}},
                        data__partition={"name": "dirichlet", "num_clients": 10, "params": {"alpha": 0.3}},
                        train__rounds=2, train__clients_per_round=3, **over)


def _digits(n_train=300, n_test=100):
    """Arrays of scikit-learn's digits, 8-bit grey images."""
    from sklearn.datasets import load_digits

    d = load_digits()
    x = np.round(d.images * 255 / 16).astype(np.uint8)
    return x[:n_train], d.target[:n_train], x[n_train:n_train + n_test], d.target[n_train:n_train + n_test]


def test_run_has_the_bits_and_the_run_directory_of_the_command_line(tmp_path, partition_cache):
    path = tmp_path / "exp.yaml"
    path.write_text(yaml.safe_dump(_tiny(tmp_path, partition_cache)))
    cli_root, api_root = tmp_path / "cli", tmp_path / "api"
    proc = subprocess.run([sys.executable, "-m", "fedray", "run", str(path), "train.lr=0.1", f"output.root={cli_root}"],
                          capture_output=True, text=True, env=QUIET_ENV, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    res = fedray.run(path, "train.lr=0.1", f"output.root={api_root}")
    [cli_dir] = list(cli_root.iterdir())
    cli_summary = json.loads((cli_dir / "summary.json").read_text())
    assert res.run_dir.name == cli_dir.name and res.status == "finished" and not res.reused
    assert res.weights_hash == cli_summary["weights_hash"] and res.accuracy == cli_summary["accuracy"]
    assert np.array_equal(res.weights, np.load(cli_dir / "final_weights.npy"))


def test_the_result_is_a_table_and_load_run_reads_the_same_object(tmp_path, partition_cache):
    res = fedray.run(_tiny(tmp_path, partition_cache))
    assert isinstance(res, fedray.RunResult) and res.run_dir.parent == tmp_path / "runs"
    assert [r["round"] for r in res.metrics] == [1, 2] and res.metrics is res.rounds
    assert res.accuracy == res.metrics[-1]["accuracy"] == res.summary["accuracy"] and 0 < res.accuracy <= 1
    assert res.weights.dtype == np.float32 and res.weights.ndim == 1 and res.weights_hash == res.summary["weights_hash"]
    assert res.metrics.column("round") == [1, 2] and res.config["train"]["rounds"] == 2
    df = res.to_pandas()
    assert list(df["round"]) == [1, 2] and "seconds.train" in df.columns and list(df["accuracy"]) == res.metrics.column(
        "accuracy")
    back = fedray.load_run(res.run_dir)
    assert (back.metrics, back.weights_hash, back.status, back.config) == (res.metrics, res.weights_hash, "finished",
                                                                          res.config)
    assert np.array_equal(back.weights, res.weights) and "accuracy=" in repr(back)
    with pytest.raises(ConfigError, match="not a run directory"):
        fedray.load_run(tmp_path)


def test_a_finished_run_is_read_back_and_repeated_calls_run_their_own_configs(tmp_path, partition_cache):
    cfg = _tiny(tmp_path, partition_cache)
    first = fedray.run(cfg)
    mtime = (first.run_dir / "summary.json").stat().st_mtime_ns
    again = fedray.run(cfg)
    assert again.reused and again.weights_hash == first.weights_hash and again.run_dir == first.run_dir
    assert (first.run_dir / "summary.json").stat().st_mtime_ns == mtime  # nothing ran
    redo = fedray.run(cfg, overwrite=True)
    assert not redo.reused and redo.weights_hash == first.weights_hash
    # fields are merged into the sections, then the overrides: another config, another run directory
    other = fedray.run(cfg, "train.rounds=3", train={"lr": 0.1}, seed=1)
    assert other.run_dir != first.run_dir and len(other.metrics) == 3
    assert (other.config["train"]["lr"], other.config["train"]["batch_size"], other.config["seed"]) == (0.1, 10, 1)
    listed = fedray.run(cfg, overrides=["train.rounds=3", "train.lr=0.1", "seed=1"])
    assert listed.reused and listed.run_dir == other.run_dir


def test_an_experiment_config_and_a_dict_with_relative_plugins(tmp_path, partition_cache, monkeypatch):
    project = tmp_path / "project"
    shutil.copytree(EXAMPLE, project, ignore=shutil.ignore_patterns("__pycache__", "runs"))
    over = ["train.rounds=2", "data.partition.num_clients=8", "train.clients_per_round=4",
            f"data.cache_dir={partition_cache}", "output.tensorboard=false"]
    try:
        from_file = fedray.run(project / "exp.yaml", *over, backend="local", output={"root": str(tmp_path / "a")})
        monkeypatch.chdir(project)  # a dict's plugins are found from the working directory
        data = yaml.safe_load((project / "exp.yaml").read_text())
        from_dict = fedray.run(data, *over, backend="local", output={"root": str(tmp_path / "b")})
        assert from_dict.run_dir.name == from_file.run_dir.name and from_dict.weights_hash == from_file.weights_hash
        from fedray.config import load_config

        cfg = load_config(project / "exp.yaml", [*over, f"output.root={tmp_path / 'c'}", "engine.backend=local"])
        assert fedray.run(cfg).weights_hash == from_file.weights_hash
        assert from_file.info["plugins"]["mymethod"]["root"] == str(project)
    finally:
        plugin_loader._forget("mymethod")


def test_in_memory_arrays_key_the_run_on_their_content(tmp_path, partition_cache):
    x, y, xt, yt = _digits()
    cfg = _tiny(tmp_path, partition_cache)
    arrays = fedray.data.from_arrays(x, y, xt, yt, name="digits")
    res = fedray.run(cfg, data=arrays)
    assert res.config["data"]["source"] == arrays.source and res.config["data"]["partition"]["num_clients"] == 10
    assert res.info["source_fingerprint"] == arrays.fingerprint and res.accuracy > 0
    same = fedray.data.from_arrays(x.copy(), y.copy(), xt, yt, name="digits")  # equal content: the same source
    assert same == arrays and fedray.run(cfg, data=same).reused
    x2 = x.copy()
    x2[0, 0, 0] ^= 1
    other = fedray.data.from_arrays(x2, y, xt, yt, name="digits")
    assert other.source != arrays.source and fedray.run(cfg, data=other).run_dir != res.run_dir
    by_name = fedray.run(cfg, f"data.source={arrays.source}", "data.params={}")
    assert by_name.reused and by_name.run_dir == res.run_dir


def test_bad_input_fails_before_any_work(tmp_path, partition_cache):
    cfg = _tiny(tmp_path, partition_cache)
    root = tmp_path / "runs"
    with pytest.raises(ConfigError, match=r"train\.roundz: unknown field in train"):
        fedray.run(cfg, "train.roundz=3")
    with pytest.raises(ConfigError, match=r"override 'train\.rounds': expected a string 'a\.b=c'"):
        fedray.run(cfg, "train.rounds")
    with pytest.raises(ConfigError, match="engine.backend"):
        fedray.run(cfg, backend="mars")
    with pytest.raises(ConfigError, match="config must be a path, a dict or an ExperimentConfig, got int"):
        fedray.run(3)
    with pytest.raises(ConfigError, match="does not exist"):
        fedray.run(tmp_path / "nope.yaml")
    with pytest.raises(ConfigError, match=r"resume=RUN_DIR\) continues that run with its own config.yaml"):
        fedray.run(cfg, resume=tmp_path)
    with pytest.raises(ConfigError, match="not a run directory"):
        fedray.run(resume=tmp_path)
    assert not root.exists()


def test_a_name_registered_outside_the_plugins_is_refused_on_ray_before_ray_starts(tmp_path, partition_cache):
    from fedray.algorithms import ALGORITHMS, Algorithm, register_algorithm

    @register_algorithm
    class Unlisted(Algorithm):
        __module__ = "somewhere_unlisted"
        name = "api_test_unlisted"

    try:
        cfg = _tiny(tmp_path, partition_cache, algorithm={"name": "api_test_unlisted"})
        with pytest.raises(ConfigError, match=r"algorithm.name: the algorithm 'api_test_unlisted' is registered by the "
                                              r"module 'somewhere_unlisted', which the config's plugins do not name.*"
                                              r"plugins=\['somewhere_unlisted'\]"):
            fedray.run(cfg, backend="ray")
        assert not (tmp_path / "runs").exists()
    finally:
        ALGORITHMS._remove_owned_by("somewhere_unlisted")


MAIN_SCRIPT = """
import sys
import fedray
from fedray.algorithms.fedavg import FedAvg

def scale(x):
    return x * {factor}

@fedray.register_algorithm
class Scaled(FedAvg):
    name = "api_test_scaled"

    def describe(self):
        return scale(1.0)

cfg = {cfg!r}
res = fedray.run(cfg, backend="local")
print("LOCAL", res.run_dir.name, res.weights_hash, res.reused)
try:
    fedray.run(cfg, backend="ray")
except fedray.ConfigError as e:
    print("REFUSED", e, "| ray imported:", "ray" in sys.modules)
"""


def test_main_code_runs_locally_named_after_its_code_and_is_refused_on_ray(tmp_path, partition_cache):
    cfg = _tiny(tmp_path, partition_cache, algorithm={"name": "api_test_scaled"})

    def script(factor):
        path = tmp_path / "nb.py"
        path.write_text(textwrap.dedent(MAIN_SCRIPT).format(cfg=cfg, factor=factor))
        proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, env=QUIET_ENV, cwd=tmp_path,
                              timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return dict(line.split(" ", 1) for line in proc.stdout.splitlines())

    first, again, edited = script(0.5), script(0.5), script(0.25)
    name, weights, reused = first["LOCAL"].split()
    assert name.startswith("api_test_scaled-") and "-main" in name and reused == "False"
    assert again["LOCAL"] == f"{name} {weights} True"  # the same code finds its finished run
    assert edited["LOCAL"].split()[0] != name  # edited code (a function the class uses): another run directory
    refused = first["REFUSED"]
    assert "algorithm.name: the algorithm 'api_test_scaled' is registered by __main__" in refused
    assert "module file next to the notebook" in refused and "plugins=['mymethod']" in refused
    assert "backend='local'" in refused and refused.endswith("ray imported: False")


@pytest.mark.ray
def test_in_memory_data_on_ray_gives_the_in_process_bits(tmp_path, partition_cache, ray_session):
    x, y, xt, yt = _digits()
    arrays = fedray.data.from_arrays(x, y, xt, yt, name="digits-ray")
    cfg = _tiny(tmp_path, partition_cache, engine={"backend": "local", "num_workers": 2})
    local = fedray.run(cfg, data=arrays, output={"root": str(tmp_path / "local")})
    on_ray = fedray.run(cfg, data=arrays, backend="ray", output={"root": str(tmp_path / "ray")})
    assert on_ray.weights_hash == local.weights_hash and on_ray.run_dir.name == local.run_dir.name
    assert np.array_equal(on_ray.weights, local.weights) and on_ray.info["source_fingerprint"] == arrays.fingerprint
    # a second call on the same Ray, with a partitioner of __main__'s: it runs in the driver, so Ray takes it
    from fedray.data.partition import PARTITIONERS, register_partitioner

    register_partitioner("api_test_blocks", lambda labels, num_clients, rng_seed, domains, natural:
                         np.array_split(np.argsort(labels, kind="stable"), num_clients), module="__main__")
    try:
        blocks = ["data.partition.name=api_test_blocks", "data.partition.params={}"]
        again = fedray.run(cfg, *blocks, data=arrays, backend="ray", output={"root": str(tmp_path / "ray")})
        here = fedray.run(cfg, *blocks, data=arrays, output={"root": str(tmp_path / "local")})
        assert again.weights_hash == here.weights_hash != on_ray.weights_hash and "-main" in again.run_dir.name
    finally:
        PARTITIONERS._remove_owned_by("__main__")


def test_sweep_and_tune_return_their_tables(tmp_path, partition_cache):
    from tests.apps.sweeps import tiny_base
    from tests.tuning.studies import study_dict, write_study

    base = tiny_base(partition_cache, backend="local")
    alpha = "data.partition.params.alpha"
    spec = {"name": "s", "base": base, "axes": {alpha: [0.1, 1.0]}, "parallel": 1,
            "table": {"rows": "algorithm.name", "columns": alpha, "metric": ["accuracy"]}}
    res = fedray.sweep(spec, "train.rounds=2", output_dir=tmp_path / "sweep")
    assert res.output_dir == tmp_path / "sweep" and [r["status"] for r in res.rows] == ["finished"] * 2
    assert res.rows.column(alpha) == [0.1, 1.0] and not res.failed and "fedavg" in res.tables
    assert (tmp_path / "sweep" / "sweep.parquet") in res.files and len(res.to_pandas()) == 2
    study = write_study(tmp_path / "study.yaml", study_dict(tmp_path, partition_cache, budget={"n_trials": 2},
                                                            output_dir=str(tmp_path / "studies")))
    tuned = fedray.tune(study)
    assert tuned.study_dir == (tmp_path / "studies" / "t").resolve() and tuned.counts == {"COMPLETE": 2}
    assert tuned.trials.column("number") == [0, 1] and tuned.best_config.is_file() and len(tuned.to_pandas()) == 2


def test_the_example_notebook_runs(tmp_path, partition_cache):
    env = {**QUIET_ENV, "EXAMPLE_OVERRIDES": f"train.rounds=1 output.root={tmp_path} data.cache_dir={partition_cache}"}
    proc = subprocess.run([sys.executable, "notebook.py"], capture_output=True, text=True, env=env, cwd=EXAMPLE,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    table = [line for line in lines if line.startswith(("mnist5k, lam=", "digits (arrays)"))]
    assert len(table) == 3 and all(line[28:].split()[0] == "1" for line in table)  # one round each
    assert len({line.split()[-1] for line in table}) == 3  # three run directories
    assert len(list(tmp_path.glob("fedavg_logitl2-*"))) == 3


def test_import_fedray_stays_light():
    code = ("import sys, fedray; fedray.run, fedray.load_run, fedray.sweep, fedray.tune, fedray.data.from_arrays; "
            "print(sorted(m for m in ('torch', 'ray', 'optuna', 'pandas', 'fedray.driver.runner') "
            "if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=QUIET_ENV, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "[]", proc.stderr
