"""Feature-analysis metrics of FedRCL (paper 002, Figures 2-3), computed on the global model's test-set
features (the embedding tap, one row per test sample):

- ``trace_within`` = Tr(Σ_W): within-class covariance, Σ_W = mean over classes c of the covariance of the
  class-c features around their class mean, weighted by class frequency;
- ``trace_between`` = Tr(Σ_B): between-class covariance, Σ_B = Σ_c π_c (μ_c − μ)(μ_c − μ)ᵀ;
- ``effective_rank`` (Definition 2, Roy & Vetterli 2007) of the total feature covariance Σ_T:
  exp(H(p)) with p_k = σ_k / Σ_i σ_i over its singular values;
- ``vci`` (variability collapse index, Xu & Liu 2023) = 1 − Tr(Σ_T⁺ Σ_B) / rank(Σ_B).

Σ_T = Σ_W + Σ_B (population covariances, divided by N).
"""

from __future__ import annotations

import numpy as np


def covariances(features: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Σ_T, Σ_W, Σ_B) of ``features`` (N, D) grouped by ``labels`` (N,), in float64."""
    x = np.asarray(features, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] != len(labels):
        raise ValueError(f"features must be (N, D) with N = len(labels); got {x.shape} and {len(labels)} labels")
    n, d = x.shape
    mu = x.mean(0)
    xc = x - mu
    total = xc.T @ xc / n
    between = np.zeros((d, d))
    for c in np.unique(labels):
        m = labels == c
        diff = x[m].mean(0) - mu
        between += (m.sum() / n) * np.outer(diff, diff)
    within = total - between
    return total, within, between


def effective_rank(matrix: np.ndarray) -> float:
    s = np.linalg.svd(np.asarray(matrix, dtype=np.float64), compute_uv=False)
    s = np.abs(s)
    if s.sum() <= 0:
        return 0.0
    p = s / s.sum()
    p = p[p > 0]
    return float(np.exp(-(p * np.log(p)).sum()))


def variability_collapse_index(total: np.ndarray, between: np.ndarray, rtol: float = 1e-10) -> float:
    rank_b = np.linalg.matrix_rank(between, tol=rtol * max(np.abs(between).max(), 1e-300))
    if rank_b == 0:
        return float("nan")
    return float(1.0 - np.trace(np.linalg.pinv(total, rcond=rtol, hermitian=True) @ between) / rank_b)


def feature_analysis(features: np.ndarray, labels: np.ndarray) -> dict:
    total, within, between = covariances(features, np.asarray(labels))
    return {
        "trace_within": float(np.trace(within)),
        "trace_between": float(np.trace(between)),
        "effective_rank": effective_rank(total),
        "vci": variability_collapse_index(total, between),
    }
