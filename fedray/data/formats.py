"""Low-level readers and helpers behind :mod:`fedray.data.sources`.

Everything here is independent of any particular dataset:

- :func:`read_idx` parses IDX files (MNIST / Fashion-MNIST), gzipped or not, validating the magic
  number and the payload size;
- :func:`load_pickle` reads the CIFAR python pickles with a restricted unpickler that only admits
  the numpy globals those files need (a pickle can otherwise run arbitrary code);
- :func:`scan_class_folders`, :func:`decode_images` form the shared image-folder reader used by the
  Tiny-ImageNet, CINIC-10, Digit-5, Office-10, DomainNet and Parquet sources (Pillow decodes, a small
  thread pool overlaps file reads and decoding, results keep the input order);
- :func:`files_signature` is the cheap content signature of on-disk data (relative path, size and
  mtime of every file) that goes into a source fingerprint;
- :func:`cached_arrays` keeps decoded arrays in the user cache directory (``$FEDRAY_CACHE_DIR``, else
  ``$XDG_CACHE_HOME/fedray``, else ``~/.cache/fedray``) as ``.npz`` files written atomically
  (temporary file + ``os.replace``), so a dataset is parsed or decoded once per content signature;
- :func:`channel_stats`, :func:`stratified_split`, :func:`stratified_subset` and
  :func:`bilinear_matrix` are the small numeric helpers shared by several sources.

Every failure is a :class:`~fedray.data.table.DataError` whose message names the offending path.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import pickle
import struct
import zlib
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from fedray.core.io import atomic_writer

from .table import DataError

__all__ = [
    "IMAGE_EXTENSIONS",
    "bilinear_matrix",
    "cache_dir",
    "cached_arrays",
    "channel_stats",
    "decode_images",
    "digest",
    "files_signature",
    "is_image_file",
    "load_pickle",
    "read_idx",
    "resize_bilinear",
    "scan_class_folders",
    "stratified_split",
    "stratified_subset",
]

IMAGE_EXTENSIONS = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".gif", ".ppm", ".pgm", ".tif", ".tiff", ".webp"})


# ----------------------------------------------------------------------------------------------
# hashing and caching


def digest(obj: Any, n: int = 16) -> str:
    """``n`` hex characters of sha256 over the canonical JSON of ``obj`` (sorted keys)."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def files_signature(paths: Iterable[Path], base: Path) -> str:
    """A cheap signature of on-disk files: sha256 over (path relative to ``base``, size, mtime_ns)
    of every file, in sorted order. Renaming, resizing or touching a file changes it."""
    h = hashlib.sha256()
    base = Path(base)
    entries = []
    for p in paths:
        p = Path(p)
        try:
            st = p.stat()
        except OSError as exc:
            raise DataError(f"cannot stat {str(p)!r}: {exc}") from exc
        try:
            rel = p.relative_to(base).as_posix()
        except ValueError:
            rel = p.as_posix()
        entries.append(f"{rel}\t{st.st_size}\t{st.st_mtime_ns}")
    for line in sorted(entries):
        h.update(line.encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    """The user cache directory for decoded datasets (not created here)."""
    env = os.environ.get("FEDRAY_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "fedray"


def cached_arrays(
    key: str,
    build: Callable[[], dict[str, np.ndarray]],
    enabled: bool = True,
    check: Callable[[dict[str, np.ndarray]], bool] | None = None,
) -> dict[str, np.ndarray]:
    """Arrays built by ``build()``, kept in ``cache_dir()/<key>.npz``.

    ``key`` must encode everything the arrays depend on (source, parameters, content signature). A
    cache file that cannot be read, or whose arrays fail ``check``, is rebuilt; one that cannot be
    written (read-only home, full disk) is skipped silently, since the cache is only an accelerator.
    Writes go to a temporary file in the same directory and are renamed into place, so concurrent
    processes never see half a file.
    """
    if not enabled:
        return build()
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in key)
    path = cache_dir() / f"{safe}.npz"
    if path.is_file():
        try:
            with np.load(path, allow_pickle=False) as z:
                cached = {k: z[k] for k in z.files}
            if check is None or check(cached):
                return cached
        except Exception:  # corrupt or foreign file: rebuild it below
            pass
    arrays = build()
    try:
        with atomic_writer(path) as f:
            np.savez(f, **arrays)
    except OSError:
        pass
    return arrays


# ----------------------------------------------------------------------------------------------
# IDX (MNIST, Fashion-MNIST)

_IDX_DTYPES = {0x08: np.dtype(np.uint8), 0x09: np.dtype(np.int8), 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
               0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def _read_maybe_gzip(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            head = f.read(2)
            f.seek(0)
            if head == b"\x1f\x8b":
                with gzip.GzipFile(fileobj=f) as g:
                    return g.read()
            return f.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"cannot read {str(path)!r}: {exc}") from exc


def read_idx(path: str | Path, ndim: int | None = None) -> np.ndarray:
    """Parse one IDX file (``.gz`` or plain, detected by content).

    Layout: 2 zero bytes, a type byte (0x08 = uint8 ...), the number of dimensions, then each
    dimension as a big-endian uint32, then the values in C order. ``ndim`` (3 for images, 1 for
    labels) is checked when given; the payload must hold exactly prod(dims) values.
    """
    path = Path(path)
    data = _read_maybe_gzip(path)
    if len(data) < 4:
        raise DataError(f"{str(path)!r}: {len(data)} bytes, too short for an IDX header (4-byte magic number)")
    z0, z1, code, nd = data[0], data[1], data[2], data[3]
    if z0 != 0 or z1 != 0 or code not in _IDX_DTYPES or nd == 0:
        raise DataError(
            f"{str(path)!r}: bad IDX magic number 0x{data[:4].hex()} (expected 0x0000TTNN: two zero bytes, a type "
            f"byte such as 08 = uint8, and the number of dimensions; MNIST images are 0x00000803, labels 0x00000801)"
        )
    if ndim is not None and nd != ndim:
        raise DataError(f"{str(path)!r}: IDX file has {nd} dimensions (magic 0x{data[:4].hex()}), expected {ndim}")
    header = 4 + 4 * nd
    if len(data) < header:
        raise DataError(f"{str(path)!r}: truncated IDX header ({len(data)} bytes, {header} needed for {nd} dimensions)")
    dims = struct.unpack(">" + "I" * nd, data[4:header])
    dtype = _IDX_DTYPES[code]
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(data) - header != expected:
        raise DataError(
            f"{str(path)!r}: IDX payload is {len(data) - header} bytes but dimensions {tuple(dims)} of {dtype} need "
            f"{expected} (file truncated or corrupt)"
        )
    arr = np.frombuffer(data, dtype=dtype, offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=False)


# ----------------------------------------------------------------------------------------------
# restricted pickles (CIFAR)

_PICKLE_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"), ("numpy._core.multiarray", "scalar"),
    ("numpy.core.numeric", "_frombuffer"), ("numpy._core.numeric", "_frombuffer"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
}


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Admits only plain containers and numpy arrays: what the CIFAR batches contain."""

    def find_class(self, module: str, name: str):
        if (module, name) in _PICKLE_GLOBALS:
            return super().find_class(module, name)
        if module == "numpy" and name.startswith("dtypes"):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed in a dataset pickle")


def load_pickle(path: str | Path) -> Any:
    """Load a python pickle written by Python 2 or 3 (``encoding='bytes'``: keys stay ``bytes`` as
    in the original CIFAR files) with the numpy-only unpickler."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            return _NumpyOnlyUnpickler(f, encoding="bytes").load()
    except FileNotFoundError as exc:
        raise DataError(f"missing file {str(path)!r}") from exc
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError, IndexError,
            OSError, KeyError) as exc:
        raise DataError(f"{str(path)!r}: not a readable python pickle ({type(exc).__name__}: {exc})") from exc


# ----------------------------------------------------------------------------------------------
# image folders and decoding


def is_image_file(p: Path) -> bool:
    """Whether ``p`` has an image extension (case-insensitive) and is not a hidden file."""
    return p.suffix.lower() in IMAGE_EXTENSIONS and not p.name.startswith(".")


def scan_class_folders(directory: Path, recursive: bool = False) -> dict[str, list[Path]]:
    """``{class folder name: sorted image files}`` for ``directory/<class>/*.<image ext>``.

    With ``recursive`` the images may sit deeper under the class folder (Tiny-ImageNet's
    ``train/<wnid>/images/``). Hidden folders and non-image files are ignored.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise DataError(f"{str(directory)!r} is not a directory (expected one sub-folder per class holding images)")
    out: dict[str, list[Path]] = {}
    for sub in sorted(p for p in directory.iterdir() if p.is_dir() and not p.name.startswith(".")):
        it = sub.rglob("*") if recursive else sub.iterdir()
        files = sorted(p for p in it if p.is_file() and is_image_file(p))
        out[sub.name] = files
    return out


def _decode_one(item: Path | bytes, mode: str, size: tuple[int, int] | None, where: str) -> np.ndarray:
    from PIL import Image, UnidentifiedImageError

    try:
        src = io.BytesIO(item) if isinstance(item, (bytes, bytearray, memoryview)) else item
        with Image.open(src) as img:
            img = img.convert(mode)
            if size is not None and img.size != (size[1], size[0]):
                img = img.resize((size[1], size[0]), Image.Resampling.BILINEAR)
            arr = np.asarray(img, dtype=np.uint8)
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError, SyntaxError) as exc:
        raise DataError(f"cannot decode image {where}: {exc}") from exc
    return arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)


def decode_images(
    items: Sequence[Path | bytes],
    channels: int = 3,
    size: int | tuple[int, int] | None = None,
    names: Sequence[str] | None = None,
    workers: int | None = None,
) -> np.ndarray:
    """Decode image files or encoded bytes into one ``uint8`` array ``(N, channels, H, W)``.

    ``channels`` 3 converts to RGB, 1 to greyscale. ``size`` (an int for square images or (H, W))
    resizes with bilinear filtering (aspect ratio is not kept); without it every image must already
    have the size of the first one. ``names`` label the items in error messages (defaults to the
    paths). Decoding runs on a small thread pool (Pillow releases the GIL) and keeps the input order.
    """
    if channels not in (1, 3):
        raise DataError(f"decode_images: channels must be 1 or 3, got {channels!r}")
    n = len(items)
    mode = "RGB" if channels == 3 else "L"
    hw = (size, size) if isinstance(size, int) else (tuple(size) if size is not None else None)
    labels = list(names) if names is not None else [repr(str(i)) if isinstance(i, Path) else f"#{k}" for k, i in enumerate(items)]
    if n == 0:
        return np.zeros((0, channels, *(hw or (0, 0))), dtype=np.uint8)
    first = _decode_one(items[0], mode, hw, labels[0])
    hw = hw or first.shape[1:]
    out = np.empty((n, channels, *hw), dtype=np.uint8)
    out[0] = first

    def work(k: int) -> None:
        arr = _decode_one(items[k], mode, hw, labels[k])
        if arr.shape[1:] != tuple(hw):
            raise DataError(
                f"image {labels[k]} is {arr.shape[2]}x{arr.shape[1]} but the first one is {hw[1]}x{hw[0]}; "
                f"pass an image size to resize them all"
            )
        out[k] = arr

    workers = workers or min(8, os.cpu_count() or 1)
    if workers <= 1 or n < 64:
        for k in range(1, n):
            work(k)
    else:
        with ThreadPoolExecutor(max_workers=workers) as ex:
            for _ in ex.map(work, range(1, n)):
                pass
    return out


# ----------------------------------------------------------------------------------------------
# numeric helpers


def channel_stats(images: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of ``x / 255`` over ``(N, C, ...)`` uint8 images, from exact
    256-bin histograms (no float copy of the data)."""
    if images.dtype != np.uint8:
        raise DataError(f"channel_stats expects uint8 images, got {images.dtype}")
    c = images.shape[1]
    values = np.arange(256, dtype=np.float64) / 255.0
    means, stds = [], []
    for ch in range(c):
        hist = np.bincount(np.ascontiguousarray(images[:, ch]).reshape(-1), minlength=256).astype(np.float64)
        total = hist.sum()
        if total == 0:
            means.append(0.0)
            stds.append(1.0)
            continue
        m = float((hist * values).sum() / total)
        var = float((hist * (values - m) ** 2).sum() / total)
        means.append(m)
        stds.append(float(np.sqrt(var)) if var > 0 else 1.0)
    return tuple(means), tuple(stds)


def stratified_split(labels: np.ndarray, test_fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Fixed per-class split: for each class (ascending) its rows are permuted by one
    ``default_rng(seed)`` and ``round(n_c * test_fraction)`` of them go to test (at least one when
    the class has two or more rows, never all of them). Returns sorted (train, test) row indices."""
    labels = np.asarray(labels)
    rng = np.random.default_rng(seed)
    test_parts = []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        k = int(round(idx.shape[0] * test_fraction))
        if idx.shape[0] >= 2:
            k = min(max(k, 1), idx.shape[0] - 1)
        else:
            k = 0
        test_parts.append(idx[:k])
    test = np.sort(np.concatenate(test_parts)) if test_parts else np.zeros(0, dtype=np.int64)
    mask = np.ones(labels.shape[0], dtype=bool)
    mask[test] = False
    return np.flatnonzero(mask), test.astype(np.int64)


def stratified_subset(labels: np.ndarray, k: int, seed: int = 0) -> np.ndarray:
    """Exactly ``min(k, N)`` sorted row indices whose class proportions follow the data's: rows are
    ranked within their class in a seeded random order and taken by increasing (rank + 0.5) / n_c."""
    labels = np.asarray(labels)
    n = labels.shape[0]
    if k >= n:
        return np.arange(n)
    rng = np.random.default_rng(seed)
    key = np.empty(n, dtype=np.float64)
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        key[idx] = (np.arange(idx.shape[0]) + 0.5) / idx.shape[0]
    order = np.lexsort((np.arange(n), key))
    return np.sort(order[:k])


def bilinear_matrix(n_in: int, n_out: int) -> np.ndarray:
    """``(n_out, n_in)`` matrix of 1-D linear interpolation with half-pixel centres and edge clamping,
    the semantics of ``torch.nn.functional.interpolate(mode='bilinear', align_corners=False)``."""
    scale = n_in / n_out
    src = np.maximum((np.arange(n_out) + 0.5) * scale - 0.5, 0.0)
    i0 = np.floor(src).astype(np.int64)
    i0 = np.minimum(i0, n_in - 1)
    i1 = np.minimum(i0 + 1, n_in - 1)
    w1 = src - i0
    m = np.zeros((n_out, n_in), dtype=np.float64)
    rows = np.arange(n_out)
    np.add.at(m, (rows, i0), 1.0 - w1)
    np.add.at(m, (rows, i1), w1)
    return m


def resize_bilinear(x: np.ndarray, size: int | tuple[int, int]) -> np.ndarray:
    """Bilinear resize of the last two axes of a float array (separable matrices, no antialias)."""
    h, w = (size, size) if isinstance(size, int) else size
    a = bilinear_matrix(x.shape[-2], h)
    b = bilinear_matrix(x.shape[-1], w)
    return np.einsum("hi,...ij,wj->...hw", a, np.asarray(x, dtype=np.float64), b, optimize=True)
