"""Slices of the cluster for several runs at once (fedray/apps/slices.py): the caps of ``plan_slices``."""

from __future__ import annotations

import pytest

from fedray.apps.slices import plan_slices
from fedray.config import ConfigError, from_dict
from tests.helpers import small_config


def _cfg(tmp_path, partition_cache, backend):
    return from_dict(small_config(tmp_path, partition_cache, engine={"backend": backend, "num_workers": 1}))


def test_ray_backend_runs_as_many_slices_as_fit(tmp_path, partition_cache):
    cap, desc = plan_slices(_cfg(tmp_path, partition_cache, "ray"), 3, workers=1, cpus_per_worker=1,
                            gpus_per_worker=0, totals=(8.0, 0.0))
    assert cap == 3 and desc["concurrency"] == 3 and desc["note"] is None
    cap, desc = plan_slices(_cfg(tmp_path, partition_cache, "ray"), 8, workers=2, cpus_per_worker=1,
                            gpus_per_worker=0, totals=(4.0, 0.0))
    assert cap == int(4.0 / desc["cpus_per_trial"])


def test_local_backend_runs_one_at_a_time_and_says_why(tmp_path, partition_cache):
    """In-process runs in threads of one process share torch's global RNG (model initialisation): two at
    once would give numbers that depend on the interleaving, so the local backend never runs two together."""
    cap, desc = plan_slices(_cfg(tmp_path, partition_cache, "local"), 4, totals=(16.0, 0.0))
    assert cap == 1 and desc["concurrency"] == 1 and desc["concurrency_requested"] == 4
    assert "one run at a time" in desc["note"] and "global RNG" in desc["note"]
    cap, desc = plan_slices(_cfg(tmp_path, partition_cache, "local"), 1, totals=(16.0, 0.0))
    assert cap == 1 and desc["note"] is None


def test_a_slice_larger_than_the_cluster_is_refused(tmp_path, partition_cache):
    with pytest.raises(ConfigError, match=r"resources: one \w+ needs 5 CPUs"):
        plan_slices(_cfg(tmp_path, partition_cache, "ray"), 2, workers=5, cpus_per_worker=1, gpus_per_worker=0,
                    field="resources", totals=(4.0, 0.0))
