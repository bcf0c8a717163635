"""The common in-memory form of every dataset fedray reads.

A split (train or test) is an Arrow table with the columns

- ``image``: ``fixed_size_list<uint8 | float32>[prod(shape)]``, the sample flattened in C-order from
  ``meta.shape`` (images are CHW; vector data such as ``synthetic`` has shape ``(D,)``);
- ``label``: ``int64`` class index in ``[0, meta.num_classes)``;
- ``domain``: ``int32`` domain index into ``meta.domains`` (only present for multi-domain data).

plus a :class:`DatasetMeta` (classes, shape, normalisation statistics) that travels beside it and is
also stored in the table's schema metadata (key ``fedray.meta``), so a shard file read on its own
still knows how to decode itself.

Images are kept as ``uint8`` where the source is 8-bit (MNIST, CIFAR, image folders): this is 4x
smaller in shards and the float conversion happens on torch batches (``x / 255``, then optional
normalisation with ``meta.mean`` / ``meta.std``). Vector sources store ``float32``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field

import numpy as np
import pyarrow as pa

META_KEY = b"fedray.meta"


class DataError(ValueError):
    """A dataset, file or partition that cannot be used; the message names the path or field."""


@dataclass(frozen=True)
class DatasetMeta:
    name: str
    num_classes: int
    shape: tuple[int, ...]  # per-sample shape, CHW for images, (D,) for vectors
    dtype: str = "uint8"  # storage dtype of the image column: "uint8" or "float32"
    classes: tuple[str, ...] = ()
    mean: tuple[float, ...] = ()  # per-channel statistics of x/255 (uint8) or of x (float32)
    std: tuple[float, ...] = ()
    domains: tuple[str, ...] = ()  # names of domains; empty for single-domain data

    def __post_init__(self):
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "classes", tuple(self.classes) or tuple(str(i) for i in range(self.num_classes)))
        object.__setattr__(self, "mean", tuple(float(m) for m in self.mean))
        object.__setattr__(self, "std", tuple(float(s) for s in self.std))
        object.__setattr__(self, "domains", tuple(self.domains))
        if self.dtype not in ("uint8", "float32"):
            raise DataError(f"DatasetMeta.dtype must be 'uint8' or 'float32', got {self.dtype!r}")

    @property
    def sample_size(self) -> int:
        return math.prod(self.shape)  # read twice per client read: np.prod cost 5 us a call

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> "DatasetMeta":
        d = json.loads(text)
        return cls(**d)


@dataclass
class Split:
    """One split of a dataset: the Arrow table and its metadata."""

    table: pa.Table
    meta: DatasetMeta

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def labels(self) -> np.ndarray:
        return self.table.column("label").to_numpy().astype(np.int64, copy=False)

    @property
    def domains(self) -> np.ndarray | None:
        if "domain" not in self.table.column_names:
            return None
        return self.table.column("domain").to_numpy().astype(np.int32, copy=False)

    def images(self) -> np.ndarray:
        """All images as one numpy array of shape (N, *meta.shape) in the storage dtype."""
        return images_of(self.table, self.meta)


@dataclass
class DataBundle:
    """What a source returns: a train and a test split sharing one :class:`DatasetMeta`."""

    train: Split
    test: Split
    meta: DatasetMeta
    fingerprint: str = ""  # stable id of the source + parameters (part of partition hashes)
    info: dict = field(default_factory=dict)


def _storage_type(meta: DatasetMeta) -> pa.DataType:
    return pa.uint8() if meta.dtype == "uint8" else pa.float32()


def make_table(images: np.ndarray, labels: np.ndarray, meta: DatasetMeta, domains: np.ndarray | None = None) -> pa.Table:
    """Build the canonical table from arrays. ``images`` has shape (N, *meta.shape) (or (N, prod))."""
    images = np.ascontiguousarray(images, dtype=np.uint8 if meta.dtype == "uint8" else np.float32)
    n = images.shape[0]
    flat = images.reshape(n, -1)
    if flat.shape[1] != meta.sample_size:
        raise DataError(
            f"{meta.name}: images have {flat.shape[1]} values per sample, metadata shape {meta.shape} needs {meta.sample_size}"
        )
    labels = np.asarray(labels)
    if labels.shape != (n,):
        raise DataError(f"{meta.name}: {labels.shape[0] if labels.ndim else 0} labels for {n} images")
    if n and (labels.min() < 0 or labels.max() >= meta.num_classes):
        raise DataError(f"{meta.name}: labels must lie in [0, {meta.num_classes}), found [{labels.min()}, {labels.max()}]")
    values = pa.array(flat.reshape(-1), type=_storage_type(meta))
    cols = {
        "image": pa.FixedSizeListArray.from_arrays(values, meta.sample_size),
        "label": pa.array(np.asarray(labels, dtype=np.int64)),  # no copy of int64 labels
    }
    if domains is not None:
        domains = np.asarray(domains, dtype=np.int32)
        if domains.shape != (n,):
            raise DataError(f"{meta.name}: {domains.shape} domain ids for {n} images")
        cols["domain"] = pa.array(domains)
    table = pa.table(cols)
    return table.replace_schema_metadata({META_KEY: meta.to_json().encode()})


def meta_of(table: pa.Table) -> DatasetMeta:
    md = table.schema.metadata or {}
    if META_KEY not in md:
        raise DataError("Arrow table has no fedray metadata (schema key 'fedray.meta')")
    return DatasetMeta.from_json(md[META_KEY])


def images_of(table: pa.Table, meta: DatasetMeta | None = None) -> np.ndarray:
    """Images of a table as (N, *shape) numpy; zero-copy when the column is one contiguous chunk."""
    meta = meta or meta_of(table)
    col = table.column("image")
    chunks = col.chunks
    if len(chunks) == 1:
        arr = chunks[0]
        flat = arr.values.to_numpy(zero_copy_only=True)
        off = arr.offset * meta.sample_size
        flat = flat[off : off + len(arr) * meta.sample_size]
    else:
        flat = np.concatenate([c.flatten().to_numpy(zero_copy_only=False) for c in chunks]) if chunks else np.zeros(0)
    return flat.reshape((table.num_rows, *meta.shape))
