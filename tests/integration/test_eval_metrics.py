"""eval.metrics end to end: the built-ins and a metric registered by a plugin module (named in ``plugins:``) computed
on the client workers give the same bits in-process and on the session's Ray with 1 and 2 workers, and the same
bits as one process evaluating the final weights; they reach metrics.jsonl, summary.json, TensorBoard, MLflow and
``fedray report --metric``; a run without eval.metrics records what it always did; an unknown name fails before
any work."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from fedray.cli import main
from fedray.config import ConfigError, from_dict
from fedray.core import plugin_loader
from fedray.driver.runner import run_experiment
from fedray.reporting.rundir import RunDir
from fedray.reporting.trackers import scalar_metrics
from tests.helpers import small_config

#: a metric of the user's: the margin of the largest logit over the label's (0 when right), as float64 sums whose
#: last bits depend on the order they are added in, reported as two values (margin.mean, margin.rms)
PLUGIN = '''
import numpy as np

import fedray


def partial(logits, labels, domains):
    """Margin of the top logit over the label's logit."""
    m = (logits.max(1).values - logits.gather(1, labels.reshape(-1, 1)).squeeze(1)).double()
    return {"sum": m.sum(), "squares": (m * m).sum(), "n": np.int64(len(labels))}


def reduce(sums):
    n = int(sums["n"])
    return {"mean": float(sums["sum"]) / n, "rms": (float(sums["squares"]) / n) ** 0.5}


fedray.register_metric("margin", partial, reduce)
'''

NAMES = ["balanced_accuracy", "macro_f1", "ece", "top5_accuracy", "per_class_accuracy", "margin"]


@pytest.fixture
def plugin(tmp_path):
    (tmp_path / "evalmetric.py").write_text(textwrap.dedent(PLUGIN))
    yield "evalmetric.py"
    plugin_loader._forget("evalmetric")


def _config(tmp_path, partition_cache, name: str, metrics=NAMES, **over):
    cfg = small_config(tmp_path / name, partition_cache, train__rounds=2, train__clients_per_round=4,
                       model__name="mlp", model__params={"hidden": [32]}, eval__batch_size=128,
                       eval__metrics=list(metrics), plugins=["evalmetric.py"], **over)
    return from_dict(cfg, base_dir=str(tmp_path))


def _run(cfg, **kw):
    return run_experiment(cfg, progress=False, log=lambda *a, **k: None, **kw)


def _metric_rows(res) -> list[dict]:
    return [{k: r[k] for k in NAMES} for r in RunDir(res.run_dir).read_metrics()]


@pytest.mark.ray
def test_same_bits_in_process_and_on_ray_with_any_workers(tmp_path, partition_cache, ray_session, plugin):
    runs = {f"local{n}": _run(_config(tmp_path, partition_cache, f"local{n}", engine__num_workers=n)) for n in (1, 2)}
    runs |= {f"ray{n}": _run(_config(tmp_path, partition_cache, f"ray{n}", engine__backend="ray",
                                      engine__num_workers=n)) for n in (1, 2)}
    rows = {k: _metric_rows(r) for k, r in runs.items()}
    assert all(v == rows["local1"] for v in rows.values()), rows  # JSON floats round-trip: equal rows = equal bits
    assert len({r.weights_hash for r in runs.values()}) == 1
    last = rows["local1"][-1]
    assert set(last["margin"]) == {"mean", "rms"} and set(last["per_class_accuracy"]) == {str(c) for c in range(10)}
    assert 0 < last["balanced_accuracy"] <= 1 and 0 <= last["ece"] <= 1 and last["top5_accuracy"] >= last["macro_f1"]

    # the same bits as one process evaluating the final weights over the whole test split
    import torch

    from fedray.core.weights import FlatParams
    from fedray.data.sources import load_source
    from fedray.metrics import evaluate
    from fedray.models import model_for_meta

    bundle = load_source("mnist5k", None)
    model = model_for_meta("mlp", bundle.meta, hidden=[32])
    FlatParams(model, torch.device("cpu")).load(np.load(runs["ray2"].run_dir / "final_weights.npy"))
    one = evaluate(model, bundle.test.images(), bundle.test.labels, meta=bundle.meta, normalize=False,
                   batch_size=128, metrics=NAMES)
    assert {k: one[k] for k in NAMES} == last
    summary = RunDir(runs["ray2"].run_dir).read_json("summary.json")
    assert {k: summary[k] for k in NAMES} == last


def test_outputs_and_a_run_without_metrics(tmp_path, partition_cache, plugin, mlflow_store):
    """metrics.jsonl, summary.json, TensorBoard, MLflow and `fedray report --metric` get the values; without
    eval.metrics the rows and the summary hold the keys they always did, with the same numbers."""
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    mlflow = {"enabled": True, "tracking_uri": mlflow_store, "experiment": "eval-metrics"}
    tracked = _run(_config(tmp_path, partition_cache, "tracked", output__tensorboard=True, output__mlflow=mlflow))
    plain = _run(_config(tmp_path, partition_cache, "plain", metrics=[]))
    rd, pd = RunDir(tracked.run_dir), RunDir(plain.run_dir)
    rows, plain_rows = rd.read_metrics(), pd.read_metrics()
    assert tracked.run_dir.name != plain.run_dir.name  # eval.metrics is part of the run's identity
    assert [set(r) - set(NAMES) for r in rows] == [set(r) for r in plain_rows]
    for r, p in zip(rows, plain_rows):
        assert (r["accuracy"], r["test_loss"], r["loss"]) == (p["accuracy"], p["test_loss"], p["loss"])
    assert set(rd.read_json("summary.json")) - set(NAMES) == set(pd.read_json("summary.json"))

    want = {k: [(r["round"], scalar_metrics(r)[k]) for r in rows] for k in
            ("balanced_accuracy", "ece", "margin/mean", "margin/rms", "per_class_accuracy/3")}
    tb = EventAccumulator(str(rd.path / "tb"))
    tb.Reload()
    for key, points in want.items():
        assert [(e.step, e.value) for e in tb.Scalars(key)] == [(s, pytest.approx(v, rel=1e-6)) for s, v in points]
    st = rd.read_json("trackers.json")["mlflow"]
    c = MlflowClient(tracking_uri=st["tracking_uri"])
    for key, points in want.items():
        assert [(m.step, m.value) for m in c.get_metric_history(st["run_id"], key)] == points, key
    final = c.get_run(st["run_id"]).data.metrics
    assert final["final/balanced_accuracy"] == rows[-1]["balanced_accuracy"]
    assert final["final/margin/mean"] == rows[-1]["margin"]["mean"]

    out = tmp_path / "report"
    assert main(["report", str(rd.path), str(pd.path), "--out", str(out), "--metric", "balanced_accuracy"]) == 0
    table = (out / "table.md").read_text()
    assert "final balanced_accuracy (%), mean ± std over seeds" in table
    assert f"{100 * rows[-1]['balanced_accuracy']:.2f}" in table
    header = (out / "summary.md").read_text().splitlines()[0]  # the single-valued metrics get a column
    assert header.endswith("| failures | balanced_accuracy | macro_f1 | ece | top5_accuracy |"), header
    assert main(["report", str(rd.path), "--out", str(out), "--metric", "margin.rms"]) == 0
    assert repr(rows[-1]["margin"]["rms"]) in (out / "table.csv").read_text()
    assert main(["report", str(pd.path), "--out", str(out), "--metric", "balanced_accuracy"]) == 2  # not recorded


@pytest.mark.parametrize("backend", ["local", pytest.param("ray", marks=pytest.mark.ray)])
def test_an_unknown_metric_fails_before_any_work(tmp_path, partition_cache, plugin, backend, request):
    """In-process the run's own checks refuse it before the data; on Ray the coordinator's, before the run
    directory is claimed (the plugin's metric is known there too: the plugins are imported first)."""
    if backend == "ray":
        request.getfixturevalue("ray_session")
    cfg = _config(tmp_path, partition_cache, backend, metrics=["ece", "margn"], engine__backend=backend)
    with pytest.raises(ConfigError, match=r"eval.metrics\[1\]: unknown metric 'margn' \(known: balanced_accuracy, "
                                          r"ece, macro_f1, margin, per_class_accuracy, top5_accuracy\)"):
        _run(cfg)
    assert not list((tmp_path / backend).rglob("run.json")) and not list((tmp_path / backend).rglob("metrics.jsonl"))
