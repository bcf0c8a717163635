"""Helpers shared by the source families of :mod:`fedray.data.sources`: the bundle builder,
fingerprints, the list-of-names reader, embedded-file lookup and the decoded image-folder reader."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..formats import cached_arrays, channel_stats, decode_images, digest, files_signature
from ..table import DataBundle, DataError, DatasetMeta, Split, make_table

TEST_FRACTION = 0.2  # fixed split of sources that ship without one
SPLIT_SEED = 0


# ----------------------------------------------------------------------------------------------
# shared helpers


def _package_file(package: str, relative: str) -> Path:
    """A data file shipped inside an installed package, located without importing the package."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(f"embedded data needs the {package!r} package, which is not installed")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise DataError(f"embedded data file {str(path)!r} is missing from the {package} installation")
    return path


def _parse_int_csv(path: Path, columns: int) -> np.ndarray:
    """A headerless CSV of non-negative integers (optionally gzipped) as an int64 array, with the
    C parser of pandas (about 20x faster than ``np.loadtxt``), else pyarrow's CSV reader."""
    try:
        import pandas as pd

        arr = pd.read_csv(path, header=None, dtype=np.int64, engine="c").to_numpy()
    except ImportError:
        import pyarrow.csv as pacsv

        tab = pacsv.read_csv(str(path), read_options=pacsv.ReadOptions(autogenerate_column_names=True))
        arr = np.column_stack([c.to_numpy().astype(np.int64) for c in tab.columns])
    except Exception as exc:
        raise DataError(f"cannot parse CSV file {str(path)!r}: {exc}") from exc
    if arr.ndim != 2 or arr.shape[1] != columns:
        raise DataError(f"{str(path)!r}: expected {columns} integer columns per row, got array of shape {arr.shape}")
    return arr


def _float_stats(x: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Mean/std along dim 1 (channels, or features of vectors) of a float array, accumulated in
    float64 over blocks of rows (no full-size float64 copy)."""
    n, ch = x.shape[0], x.shape[1]
    if n == 0:
        return (0.0,) * ch, (1.0,) * ch
    flat = x.reshape(n, ch, -1)
    s1 = np.zeros(ch)
    s2 = np.zeros(ch)
    for lo in range(0, n, 65536):
        blk = flat[lo:lo + 65536].astype(np.float64)
        s1 += blk.sum(axis=(0, 2))
        s2 += np.square(blk).sum(axis=(0, 2))
    m = n * flat.shape[2]
    mean = s1 / m
    var = np.maximum(s2 / m - mean**2, 0.0)
    std = np.where(var > 0, np.sqrt(var), 1.0)
    return tuple(float(v) for v in mean), tuple(float(v) for v in std)


def _bundle(
    name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
    classes: Sequence[str],
    fingerprint: str,
    *,
    domains: Sequence[str] = (),
    d_train: np.ndarray | None = None,
    d_test: np.ndarray | None = None,
    extra: dict[str, tuple[np.ndarray, np.ndarray]] | None = None,
    info: dict | None = None,
    stats: tuple[tuple[float, ...], tuple[float, ...]] | None = None,
) -> DataBundle:
    """Assemble a bundle: metadata (statistics over the train split), tables, extra columns. ``stats``: the train
    split's ``(mean, std)`` when the source has them already (what :func:`_float_stats` gave for these very arrays,
    kept with a cache), else computed here."""
    dtype = "uint8" if x_train.dtype == np.uint8 else "float32"
    if stats is not None:
        mean, std = stats
    elif dtype == "uint8":
        mean, std = channel_stats(x_train)
    else:
        mean, std = _float_stats(x_train)
    meta = DatasetMeta(name=name, num_classes=len(classes), shape=x_train.shape[1:], dtype=dtype,
                       classes=tuple(classes), mean=mean, std=std, domains=tuple(domains))
    tables = []
    for k, (x, y, d) in enumerate(((x_train, y_train, d_train), (x_test, y_test, d_test))):
        table = make_table(x, y, meta, d if domains else None)
        for col, arrays in (extra or {}).items():
            table = table.append_column(col, pa.array(arrays[k]))
        tables.append(table)
    info = dict(info or {})
    info.update(train_rows=int(x_train.shape[0]), test_rows=int(x_test.shape[0]))
    return DataBundle(Split(tables[0], meta), Split(tables[1], meta), meta, fingerprint=fingerprint, info=info)


def _single_thread_blas():
    """A context limiting BLAS to one thread (threadpoolctl, a scikit-learn dependency), else a no-op."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        import contextlib

        return contextlib.nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def _fingerprint(name: str, version: str, params: dict, extra: Any = None) -> str:
    return f"{name}:{version}:{digest({'params': params, 'extra': extra})}"


def _err(source: str, msg: str) -> DataError:
    return DataError(f"source {source!r}: {msg}")


def _as_names(source: str, key: str, value: Any) -> list[str] | None:
    """None, a list of names or a comma-separated string; duplicates are rejected."""
    if value is None:
        return None
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or not value or not all(isinstance(v, (str, int)) for v in value):
        raise _err(source, f"parameter {key} must be a non-empty list of names, got {value!r}")
    names = [str(v) for v in value]
    dup = sorted({v for v in names if names.count(v) > 1})
    if dup:
        raise _err(source, f"parameter {key} lists {dup} more than once")
    return names


# ----------------------------------------------------------------------------------------------
# on-disk: image folders (shared reader)


@dataclass
class _FileSplits:
    """Image files with labels (and domains) for both splits, before decoding."""

    train: list[Path]
    y_train: list[int]
    test: list[Path]
    y_test: list[int]
    d_train: list[int] = field(default_factory=list)
    d_test: list[int] = field(default_factory=list)


def _decode_bundle(src: str, base: Path, files: _FileSplits, classes: Sequence[str], image_size: int | None,
                   resolved: dict, cache: bool, domains: Sequence[str] = (), info: dict | None = None) -> DataBundle:
    """Decode both splits' files to RGB uint8 (resized to ``image_size`` when given), through the
    decoded-array cache keyed by the files' signature and the parameters."""
    if not files.train:
        raise _err(src, f"no training images found under {str(base)!r}")
    sig = files_signature([*files.train, *files.test], base)
    fp = _fingerprint(src, "v1", resolved, [str(base.resolve()), sig])

    def build() -> dict[str, np.ndarray]:
        return {"x_train": decode_images(files.train, 3, image_size),
                "x_test": decode_images(files.test, 3, image_size)}

    def check(a: dict[str, np.ndarray]) -> bool:
        return (set(a) == {"x_train", "x_test"} and a["x_train"].shape[0] == len(files.train)
                and a["x_test"].shape[0] == len(files.test) and a["x_train"].dtype == np.uint8)

    arrays = cached_arrays(f"{src}-{digest(fp, 24)}", build, cache, check)
    x_tr, x_te = arrays["x_train"], arrays["x_test"]
    if x_te.shape[0] and x_te.shape[1:] != x_tr.shape[1:]:
        raise _err(src, f"test images are {x_te.shape[1:]} but train images {x_tr.shape[1:]}; set image_size")
    if x_te.shape[0] == 0:
        x_te = np.zeros((0, *x_tr.shape[1:]), dtype=np.uint8)
    return _bundle(
        src, x_tr, np.asarray(files.y_train, dtype=np.int64), x_te, np.asarray(files.y_test, dtype=np.int64), classes,
        fp, domains=domains, d_train=np.asarray(files.d_train, dtype=np.int32) if domains else None,
        d_test=np.asarray(files.d_test, dtype=np.int32) if domains else None,
        info={"source": src, "root": str(base), "params": resolved, **(info or {})},
    )
