"""tuning.outputs: the study's output files, single and multi objective."""

from __future__ import annotations

import pytest
import yaml

from fedray.config import load_config
from tests.tuning.studies import study_dict

optuna = pytest.importorskip("optuna")

from tuning.outputs import write_outputs  # noqa: E402
from tuning.study import parse_study  # noqa: E402


# ------------------------------------------------------------------------------------------ outputs
def _synthetic_study(spec, n_complete, values=None):
    study = optuna.create_study(directions=spec.directions)
    dists = spec.distributions()
    for i in range(n_complete):
        params = {"algorithm.params.mu": 10 ** (-4 + 3 * i / max(n_complete, 2)), "train.lr": 0.02 + 0.01 * (i % 6)}
        v = values(i) if values else 0.5 + 0.05 * i - 0.3 * abs(params["train.lr"] - 0.05)
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions=dists, values=v if isinstance(v, list) else [v],
            intermediate_values={1: 0.3, 2: 0.4}, user_attrs={"run_dir": f"/x/trial-{i:04d}", "started_at": 1.0e9}))
    study.add_trial(optuna.trial.create_trial(params={"algorithm.params.mu": 1e-3, "train.lr": 0.03},
                                              distributions=dists, state=optuna.trial.TrialState.PRUNED,
                                              intermediate_values={1: 0.1}))
    return study


def test_outputs_single_and_multi_objective(tmp_path, partition_cache, monkeypatch):
    import tuning.outputs

    monkeypatch.setattr(tuning.outputs, "IMPORTANCE_TREES", 8)  # the default 64 trees take seconds per call
    spec = parse_study(study_dict(tmp_path, partition_cache), source_path=tmp_path / "s.yaml")
    files = write_outputs(_synthetic_study(spec, 6), spec, tmp_path / "a", log=lambda m: None)
    names = {p.name for p in files}
    for f in ("trials.csv", "trials.md", "best_config.yaml", "history.png", "intermediate.png", "slice.png",
              "importance.png", "contour_mu__lr.png", "importance.yaml"):
        assert f in names, f
    assert all(p.stat().st_size > 0 for p in files)
    cfg = load_config(tmp_path / "a" / "best_config.yaml")
    assert cfg.algorithm.name == "fedprox" and 0.02 <= cfg.train.lr <= 0.08
    imp = yaml.safe_load((tmp_path / "a" / "importance.yaml").read_text())
    again, why = tuning.outputs.param_importances(_synthetic_study(spec, 6), spec)
    assert why is None and {k: float(v) for k, v in again.items()} == imp["importances"]  # fixed seed

    # fewer than two complete trials: no importances, everything else still written
    msgs = []
    files = write_outputs(_synthetic_study(spec, 1), spec, tmp_path / "c", log=msgs.append)
    assert "importance.png" not in {p.name for p in files} and "best_config.yaml" in {p.name for p in files}
    assert any("at least 2 complete trials" in m for m in msgs)
    imp, why = tuning.outputs.param_importances(_synthetic_study(spec, 3, values=lambda i: 0.5), spec)
    assert imp is None and "different objective values" in why
    files = write_outputs(optuna.create_study(direction="maximize"), spec, tmp_path / "d", log=msgs.append)
    assert {p.name for p in files} == {"trials.csv", "trials.md"}

    d = study_dict(tmp_path, partition_cache,
                   multi_objective=[{"metric": "accuracy"}, {"metric": "bytes_total", "direction": "minimize"}])
    d.pop("objective")
    mspec = parse_study(d, source_path=tmp_path / "m.yaml")
    assert mspec.pruning is False and mspec.directions == ["maximize", "minimize"]
    study = _synthetic_study(mspec, 5, values=lambda i: [0.5 + 0.1 * i, 100.0 * (i + 1) ** 2 if i != 2 else 1e6])
    files = write_outputs(study, mspec, tmp_path / "m", log=lambda m: None)
    names = {p.name for p in files}
    assert "pareto.png" in names and "best_config.yaml" not in names
    pareto = sorted(p.name for p in files if p.parent.name == "pareto")
    assert pareto == ["trial-0000.yaml", "trial-0001.yaml", "trial-0003.yaml", "trial-0004.yaml"]
    load_config(tmp_path / "m" / "pareto" / "trial-0004.yaml")
