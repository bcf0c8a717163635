"""Checkpoints without pickle: numpy arrays in an ``.npz`` plus a JSON tree for everything else.

A checkpoint is a tree of dicts, lists, tuples, numpy arrays and scalars, strings, numbers, booleans and
None (the coordinator's weights, server-optimizer and algorithm state). :func:`write_checkpoint` stores
every array (and numpy scalar, with its dtype) as an entry of the ``.npz`` and the tree as JSON in the
entry ``__tree__``, with dict keys kept with their types (FedCCL's per-client signals are keyed by int
client ids). :func:`read_checkpoint` reads it back with ``np.load(allow_pickle=False)``: a planted pickle
is never executed, and anything that is not such a file is a :class:`CheckpointError`. Round trips are
exact: arrays keep dtype and bits, Python floats go through ``repr``.

Per-client records (FedCCL's signals, FedPCL's prototypes: a dict from int client ids to dicts of arrays with
the same fields, dtypes and trailing shapes) are stored packed, as the keys, one concatenation per field and
the records' lengths, and read back as the same dict of dicts (views of those arrays): a checkpoint of 100,000
clients' records is a few npz entries, not 200,000 (11 s to write and 21 s to read, measured, before).
"""

from __future__ import annotations

import json
import math
import zipfile
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from fedray.core.errors import ConfigError

__all__ = ["CheckpointError", "read_checkpoint", "write_checkpoint"]

_TREE = "__tree__"
_PACK_MIN = 16  # dicts of at least this many per-client records are packed


class CheckpointError(ConfigError):
    """A checkpoint that cannot be read back exactly (missing, damaged, not a fedray checkpoint)."""


def _encode(obj: Any, arrays: dict) -> Any:
    if isinstance(obj, np.ndarray) or isinstance(obj, np.generic):
        if obj.dtype == object:
            raise TypeError("checkpoint: object arrays cannot be stored without pickle")
        key = f"a{len(arrays)}"
        arrays[key] = np.asarray(obj)
        return {"__array__" if isinstance(obj, np.ndarray) else "__scalar__": key}
    if isinstance(obj, dict):
        fields = _record_fields(obj)
        if fields is not None:
            return {"__records__": _pack(obj, fields, arrays)}
        return {"__dict__": [[_encode(k, arrays), _encode(v, arrays)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return {"__list__" if isinstance(obj, list) else "__tuple__": [_encode(v, arrays) for v in obj]}
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else {"__float__": repr(obj)}
    raise TypeError(f"checkpoint: cannot store a {type(obj).__name__} without pickle")


def _record_fields(obj: dict) -> tuple[str, ...] | None:
    """The field names when ``obj`` maps int keys (int64 range) to dicts of arrays with one list of fields (in one
    order), and per field one dtype (not object) and one shape after the first axis; else None."""
    if len(obj) < _PACK_MIN:
        return None
    fields: tuple[str, ...] | None = None
    specs: list[tuple[np.dtype | None, tuple[int, ...]]] = []
    for k, v in obj.items():
        if type(k) is not int or not -(1 << 63) <= k < 1 << 63 or not isinstance(v, dict) or not v:
            return None
        if fields is None:
            fields = tuple(v)
            if not all(type(f) is str for f in fields):
                return None
            specs = [(a.dtype, a.shape[1:]) if isinstance(a, np.ndarray) and a.ndim else (None, ()) for a in v.values()]
            if any(dt is None or dt.hasobject for dt, _ in specs):
                return None
        elif tuple(v) != fields:
            return None
        for a, (dt, tail) in zip(v.values(), specs):
            if not isinstance(a, np.ndarray) or a.dtype != dt or a.shape[1:] != tail or not a.ndim:
                return None
    return fields


def _pack(obj: dict, fields: tuple[str, ...], arrays: dict) -> dict:
    def put(a: np.ndarray) -> str:
        key = f"a{len(arrays)}"
        arrays[key] = a
        return key

    keys = put(np.fromiter(obj.keys(), dtype=np.int64, count=len(obj)))
    out = []
    for f in fields:
        parts = [v[f] for v in obj.values()]
        out.append([f, put(np.concatenate(parts)), put(np.array([p.shape[0] for p in parts], dtype=np.int64))])
    return {"keys": keys, "fields": out}


def _unpack(node: dict, arrays) -> dict:
    keys = arrays[node["keys"]].tolist()
    columns = []
    for name, data, lengths in node["fields"]:
        cuts = np.cumsum(arrays[lengths])[:-1]
        columns.append((name, np.split(arrays[data], cuts)))
    return {k: {name: parts[i] for name, parts in columns} for i, k in enumerate(keys)}


def _decode(obj: Any, arrays) -> Any:
    if isinstance(obj, dict):
        if "__records__" in obj:
            return _unpack(obj["__records__"], arrays)
        if "__array__" in obj:
            return arrays[obj["__array__"]]
        if "__scalar__" in obj:
            return arrays[obj["__scalar__"]][()]
        if "__dict__" in obj:
            return {_decode(k, arrays): _decode(v, arrays) for k, v in obj["__dict__"]}
        if "__list__" in obj:
            return [_decode(v, arrays) for v in obj["__list__"]]
        if "__tuple__" in obj:
            return tuple(_decode(v, arrays) for v in obj["__tuple__"])
        if "__float__" in obj:
            return float(obj["__float__"])
        raise CheckpointError(f"unknown node {sorted(obj)} in the checkpoint tree")
    return obj


def write_checkpoint(f: BinaryIO, state: dict) -> None:
    """Write ``state`` to the binary file ``f`` (see the module docstring)."""
    arrays: dict[str, np.ndarray] = {}
    tree = json.dumps(_encode(state, arrays), separators=(",", ":"))
    arrays[_TREE] = np.frombuffer(tree.encode(), dtype=np.uint8)
    np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy's stubs type **kwds as allow_pickle


def read_checkpoint(path: str | Path) -> dict:
    """The state written by :func:`write_checkpoint` (no pickle is ever loaded)."""
    try:
        with np.load(path, allow_pickle=False) as z:
            if _TREE not in z.files:
                raise CheckpointError(f"{path}: not a fedray checkpoint (no {_TREE} entry)")
            arrays = {k: z[k] for k in z.files if k != _TREE}
            tree = json.loads(z[_TREE].tobytes().decode())
    except CheckpointError:
        raise
    except (OSError, ValueError, KeyError, zipfile.BadZipFile, EOFError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: unreadable checkpoint ({type(e).__name__}: {e})") from None
    return _decode(tree, arrays)
