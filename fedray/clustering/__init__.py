"""Clustering used by prototype methods (FedCCL, FPL): FINCH and its helpers."""

from fedray.clustering.finch import DISTANCES, FinchResult, cluster_means, finch, finch_means, first_neighbors

__all__ = ["DISTANCES", "FinchResult", "cluster_means", "finch", "finch_means", "first_neighbors"]
