"""The example's partitioner. It runs in the driver, which imports no torch on Ray: this module imports none."""

from __future__ import annotations

import numpy as np

import fedray
from fedray import ParamSpec


@fedray.register_partitioner("sorted_blocks", params={
    "jitter": ParamSpec(0.0, "std of the Gaussian noise added to the labels before sorting (0: pure blocks)", float,
                        ge=0)})
def sorted_blocks(labels, num_clients, rng_seed, domains, natural, jitter):
    """Contiguous, equal-size blocks of the rows sorted by (noisy) label: strong label skew."""
    labels = np.asarray(labels)
    key = labels + np.random.default_rng(rng_seed).normal(0.0, jitter, size=labels.shape) if jitter else labels
    order = np.argsort(key, kind="stable")
    return [np.sort(block) for block in np.array_split(order, num_clients)]
