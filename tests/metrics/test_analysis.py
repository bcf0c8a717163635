"""FedRCL's feature-analysis metrics (fedray/metrics/analysis.py) against loop references, and their path
through a run's metrics.jsonl into `fedray report`'s analysis.png."""

from __future__ import annotations

import numpy as np
import pytest

from fedray.metrics.analysis import covariances, effective_rank, feature_analysis, variability_collapse_index
from tests.helpers import small_config


def _loop_covariances(x, y):
    """Σ_T, Σ_W = Σ_c π_c Cov_c, Σ_B = Σ_c π_c (μ_c − μ)(μ_c − μ)ᵀ with population covariances, one sample at a time."""
    n, d = x.shape
    mu = x.mean(0)
    total = np.zeros((d, d))
    for i in range(n):
        total += np.outer(x[i] - mu, x[i] - mu) / n
    within, between = np.zeros((d, d)), np.zeros((d, d))
    for c in sorted(set(y.tolist())):
        rows = [i for i in range(n) if y[i] == c]
        mc = x[rows].mean(0)
        for i in rows:
            within += np.outer(x[i] - mc, x[i] - mc) / n
        between += len(rows) / n * np.outer(mc - mu, mc - mu)
    return total, within, between


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_covariances_match_loop_reference(seed):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, size=60)
    x = rng.normal(size=(60, 5)) + y[:, None] * 0.7
    for got, ref in zip(covariances(x.astype(np.float32), y), _loop_covariances(x.astype(np.float32).astype(np.float64), y)):
        np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-10)


def test_effective_rank_definition_2():
    assert effective_rank(np.eye(7)) == pytest.approx(7.0)
    assert effective_rank(np.diag([3.0, 0, 0, 0])) == pytest.approx(1.0)
    s = np.array([4.0, 2.0, 1.0, 1.0])
    p = s / s.sum()
    assert effective_rank(np.diag(s)) == pytest.approx(np.exp(-(p * np.log(p)).sum()))
    assert effective_rank(np.zeros((3, 3))) == 0.0


def test_vci_zero_when_features_collapse_to_class_means_and_near_one_when_noise_dominates():
    rng = np.random.default_rng(0)
    means = rng.normal(size=(4, 6)) * 5
    y = np.repeat(np.arange(4), 30)
    collapsed = means[y]
    t, w, b = covariances(collapsed, y)
    assert np.trace(w) == pytest.approx(0.0, abs=1e-9)
    assert variability_collapse_index(t, b) == pytest.approx(0.0, abs=1e-6)
    noisy = means[y] * 0.01 + rng.normal(size=(120, 6)) * 10
    t, w, b = covariances(noisy, y)
    assert variability_collapse_index(t, b) > 0.9
    assert np.isnan(variability_collapse_index(t, np.zeros_like(b)))


def test_feature_analysis_keys_and_errors():
    rng = np.random.default_rng(0)
    y = np.arange(20) % 2
    out = feature_analysis(rng.normal(size=(20, 3)), y)
    assert set(out) == {"trace_within", "trace_between", "effective_rank", "vci"}
    assert out["trace_within"] > 0 and 1.0 <= out["effective_rank"] <= 3.0
    with pytest.raises(ValueError, match="features must be"):
        feature_analysis(rng.normal(size=(19, 3)), y)


def test_analysis_logged_every_k_rounds_and_plotted_by_report(tmp_path, partition_cache):
    from fedray.config import from_dict
    from fedray.driver.runner import run_experiment
    from fedray.reporting.report import report

    cfg = small_config(tmp_path, partition_cache, model={"name": "cnn_taps", "params": {"widths": [4, 8, 8, 8]}},
                       train={"rounds": 3, "clients_per_round": 2, "batch_size": 20, "lr": 0.05},
                       eval={"every": 1, "analysis_every": 2})
    res = run_experiment(from_dict(cfg), progress=False, log=lambda *a: None)
    logged = [r["round"] for r in res.rounds if r.get("analysis")]
    assert logged == [2, 3]  # every 2 rounds and at the last one
    ana = res.rounds[-1]["analysis"]
    assert ana["trace_within"] > 0 and ana["trace_between"] > 0 and 1.0 <= ana["effective_rank"] <= 8.0
    _, files = report([res.run_dir], out=tmp_path / "rep")
    assert (tmp_path / "rep" / "analysis.png") in files
