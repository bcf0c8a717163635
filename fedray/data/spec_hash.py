"""The name of a partition: a stable hash of (format, source fingerprint, resolved spec, index arrays).

``partition_hash`` names the cache directory ``root/<hash>`` and is recorded in ``run.json``;
``content_fingerprint`` identifies a source without one by its content.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from .client_index import CHUNK_ROWS, ClientIndex
from .partition import canonical_params
from .table import DataError, Split, images_of

__all__ = ["FORMAT_VERSION", "content_fingerprint", "partition_hash", "resolve_spec"]

FORMAT_VERSION = 1  # enters partition_hash: changing it renames every cached partition


def _jsonable(key: str, value: Any) -> Any:
    """Plain JSON value for a spec entry (numpy scalars/arrays and tuples converted)."""
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    if isinstance(value, (np.bool_,)):
        return bool(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return [_jsonable(key, v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(f"{key}.{k}", v) for k, v in value.items()}
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise DataError(f"partition spec field {key!r}: value {value!r} of type {type(value).__name__} is not JSON-serialisable")


def resolve_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """Validate a partition spec ``{"name", "num_clients", "seed", **params}`` and return it with every
    partitioner default filled in and values coerced to canonical JSON types."""
    if not isinstance(spec, dict):
        raise DataError(f"partition spec must be a mapping, got {type(spec).__name__}")
    for key in ("name", "num_clients", "seed"):
        if key not in spec:
            raise DataError(f"partition spec is missing the field {key!r} (got fields {sorted(spec)})")
    name = spec["name"]
    if not isinstance(name, str):
        raise DataError(f"partition spec field 'name' must be a string, got {name!r}")
    num_clients = spec["num_clients"]
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise DataError(f"partition spec field 'num_clients' must be an integer >= 1, got {num_clients!r}")
    seed = spec["seed"]
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise DataError(f"partition spec field 'seed' must be a non-negative integer, got {seed!r}")
    params = {k: _jsonable(k, v) for k, v in spec.items() if k not in ("name", "num_clients", "seed")}
    params = canonical_params(name, params, num_clients=int(num_clients))
    return {"name": name, "num_clients": int(num_clients), "seed": int(seed), **params}


def _canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def partition_hash(fingerprint: str, spec: dict[str, Any], parts: Sequence[np.ndarray]) -> str:
    """16 hex characters of sha256 over (format, fingerprint, resolved spec) and the index arrays: the JSON, then
    every client's size (int64 little-endian), then every client's rows in client order (int64 little-endian).

    A :class:`ClientIndex` feeds sha256 the same bytes from its two flat arrays, a few MB at a time (no per-client
    step); a list of arrays is hashed client by client, as before (``tests/data/test_client_index.py`` checks
    that both give the same hash)."""
    h = hashlib.sha256()
    h.update(_canonical_json({"format": FORMAT_VERSION, "fingerprint": fingerprint, "spec": spec}))
    if isinstance(parts, ClientIndex):
        off = parts.offsets
        for lo in range(0, len(parts), CHUNK_ROWS):
            h.update(np.ascontiguousarray(np.diff(off[lo:lo + CHUNK_ROWS + 1]), dtype="<i8"))
        for lo in range(0, parts.rows.size, CHUNK_ROWS):
            h.update(np.ascontiguousarray(parts.rows[lo:lo + CHUNK_ROWS], dtype="<i8"))
        return h.hexdigest()[:16]
    sizes = np.fromiter((len(p) for p in parts), dtype=np.int64, count=len(parts))
    h.update(sizes.astype("<i8").tobytes())
    for p in parts:
        h.update(np.ascontiguousarray(p, dtype="<i8").tobytes())
    return h.hexdigest()[:16]


def content_fingerprint(split: Split) -> str:
    """A fingerprint of a split's content (metadata, labels, images, domains) for bundles that carry
    no ``fingerprint`` of their own."""
    h = hashlib.sha256()
    h.update(split.meta.to_json().encode())
    table = split.table
    for name in ("label", "image", "domain", "client"):
        if name not in table.column_names:
            continue
        h.update(name.encode())
        col = table.column(name)
        if name == "image":
            h.update(np.ascontiguousarray(images_of(table, split.meta)).tobytes())
        else:
            h.update(np.ascontiguousarray(col.to_numpy()).tobytes())
    return "content:" + h.hexdigest()[:32]
