"""Client sampling: the clients of a round from default_rng([seed, round]) alone, read at the sampled clients only."""

from __future__ import annotations

import numpy as np

from fedray.engine.sampling import sample_clients


def test_sampling_is_the_same_from_an_array_or_a_list_and_skips_empty_clients():
    sizes = np.random.default_rng(0).integers(0, 3, 20_000)  # a third of the clients are empty
    for rnd in range(1, 30):
        got = sample_clients(sizes, 500, 7, rnd, over_selection=0.2 if rnd % 2 else 0.0)
        assert got == sample_clients(sizes.tolist(), 500, 7, rnd, over_selection=0.2 if rnd % 2 else 0.0)
        assert all(type(c) is int and sizes[c] > 0 for c in got) and len(set(got)) == len(got)
        drawn = np.random.default_rng([7, rnd]).choice(20_000, size=600 if rnd % 2 else 500, replace=False)
        assert got == [int(c) for c in drawn if sizes[c] > 0]  # sampled order kept


def test_sampling_reads_the_sizes_at_the_sampled_clients_only():
    class Sizes(np.ndarray):  # an array that counts the clients whose size is read
        reads = 0

        def __getitem__(self, key):
            Sizes.reads += np.size(key)
            return super().__getitem__(key)

    sizes = np.ones(2_000_000, dtype=np.int64).view(Sizes)
    got = sample_clients(sizes, 1_000, 0, 3)
    assert len(got) == 1_000 and Sizes.reads == 1_000
