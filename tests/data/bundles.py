"""A toy data bundle shared by the data tests (not a test file); the ``bundle`` fixture built from it is in
tests/data/conftest.py."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from fedray.data.table import DataBundle, DatasetMeta, Split, make_table

N_ROWS = 1200


def toy_bundle(n=N_ROWS, *, with_domain=True, natural=False, fingerprint="toy-v1", seed=0) -> DataBundle:
    rng = np.random.default_rng(seed)
    meta = DatasetMeta(
        "toy", 10, (1, 28, 28), mean=(0.13,), std=(0.31,), domains=("a", "b", "c") if with_domain else ()
    )
    x = rng.integers(0, 256, (n, 1, 28, 28), dtype=np.uint8)
    y = rng.integers(0, 10, n)
    d = (np.arange(n) % 3).astype(np.int32) if with_domain else None
    table = make_table(x, y, meta, d)
    if natural:
        table = table.append_column("client", pa.array((np.arange(n) % 7).astype(np.int64)))
    train = Split(table, meta)
    test = Split(make_table(x[:20], y[:20], meta, None if d is None else d[:20]), meta)
    return DataBundle(train, test, meta, fingerprint=fingerprint)
