"""The ``parquet`` source: a generic Parquet / Arrow image table (e.g. a Hugging Face datasets export)."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..formats import cached_arrays, decode_images, digest, files_signature, stratified_split
from ..table import META_KEY, DataBundle, DataError, DatasetMeta
from .common import SPLIT_SEED, TEST_FRACTION, _as_names, _bundle, _err, _fingerprint


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


def _resolve(root: Path | None, p) -> Path | None:
    """A path parameter: absolute, or relative to ``root`` (when set)."""
    if p is None:
        return None
    q = Path(str(p)).expanduser()
    return q if q.is_absolute() or root is None else root / q


def _locate(root: Path | None, path, train_path, test_path) -> tuple[list[Path], list[Path], Path, str]:
    """``(train files, test files, base folder, where)`` named by ``root`` and the path parameters."""
    src = "parquet"
    base = _resolve(root, path) or root
    if train_path is not None:
        tr_files = _table_files(_resolve(root, train_path))
        te_files = _table_files(_resolve(root, test_path)) if test_path else []
        where = str(_resolve(root, train_path))
        if not tr_files:
            raise _err(src, f"train_path {where!r} holds no .parquet/.arrow files; expected {_PARQUET_LAYOUT}")
        if test_path and not te_files:
            raise _err(src, f"test_path {str(_resolve(root, test_path))!r} holds no .parquet/.arrow files")
        base = _resolve(root, train_path).parent
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
    return tr_files, te_files, base, where


def _read_split(files: list[Path], cols: list[str], where: str) -> tuple[pa.Table | None, pa.Schema | None]:
    """The ``cols`` of every file of one split concatenated, and the first file's full schema."""
    if not files:
        return None, None
    tabs = [_read_table(f, cols) for f in files]
    for f, t in zip(files, tabs):
        miss = [c for c in cols if c not in t.column_names]
        if miss:
            raise _err("parquet", f"{str(f)!r} has no column(s) {miss} (columns: {t.column_names}); set image_column / "
                                  f"label_column / domain_column")
    try:
        return pa.concat_tables([t.select(cols) for t in tabs], promote_options="permissive"), tabs[0].schema
    except pa.ArrowException as exc:
        raise _err("parquet", f"tables in {where!r} have incompatible schemas: {exc}") from exc


class _ParquetTables:
    """The train (and optional test) table of one ``parquet`` load, with what their schema tells:
    Hugging Face ``ClassLabel`` names and, for tables fedray wrote, the stored :class:`DatasetMeta`."""

    def __init__(self, tr_files: list[Path], te_files: list[Path], where: str, image_column: str, label_column: str,
                 domain_column: str | None):
        self.tr_files, self.te_files = tr_files, te_files
        self.image_column, self.label_column, self.domain_column = image_column, label_column, domain_column
        cols = [image_column, label_column] + ([domain_column] if domain_column else [])
        self.train, self.full_schema = _read_split(tr_files, cols, where)  # the first train file's schema
        self.test, _ = _read_split(te_files, cols, where)
        self._inspect()

    @classmethod
    def of_tables(cls, train: pa.Table, test: pa.Table | None, label: str, image_column: str, label_column: str,
                  domain_column: str | None) -> "_ParquetTables":
        """Tables already in memory (:func:`fedray.data.memory.from_hf`); ``label`` names them in errors, and a
        relative image path is taken relative to the working directory."""
        self = cls.__new__(cls)
        self.tr_files, self.te_files = [Path(label)], ([Path(label)] if test is not None else [])
        self.image_column, self.label_column, self.domain_column = image_column, label_column, domain_column
        self.train, self.test, self.full_schema = train, test, train.schema
        self._inspect()
        return self

    def _inspect(self) -> None:
        self.stored_meta = None
        if META_KEY in (self.full_schema.metadata or {}):
            self.stored_meta = DatasetMeta.from_json(self.full_schema.metadata[META_KEY])
        self.img_type = self.train.schema.field(self.image_column).type
        self.encoded = (pa.types.is_struct(self.img_type) or pa.types.is_binary(self.img_type)
                        or pa.types.is_large_binary(self.img_type))

    def check_nulls(self) -> None:
        for t, files in ((self.train, self.tr_files), (self.test, self.te_files)):
            if t is not None and (t.column(self.label_column).null_count
                                  or (self.domain_column and t.column(self.domain_column).null_count)):
                raise _err("parquet", f"null labels or domains in {[str(f) for f in files]}")

    def names_of(self, column: str, explicit: list[str] | None) -> tuple[list[str] | None, Callable]:
        """(names, fn: ChunkedArray -> int array) for a label/domain column."""
        tables = [t for t in (self.train, self.test) if t is not None]
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
                raise _err("parquet", f"column {column!r} has values {unknown[:5]} that are not among {names}")
            return names, lambda col: np.asarray([lookup[v] for v in _plain(col).cast(pa.string()).to_pylist()],
                                                 dtype=np.int64)
        if not pa.types.is_integer(typ):
            raise _err("parquet", f"column {column!r} is {typ}, expected integers or strings")
        names = explicit or _hf_names(self.full_schema, column)
        meta = self.stored_meta
        if names is None and meta is not None and column == self.label_column:
            names = list(meta.classes)
        if names is None and meta is not None and column == self.domain_column and meta.domains:
            names = list(meta.domains)
        return names, lambda col: _plain(col).to_numpy().astype(np.int64)

    def images(self, t: pa.Table, files: list[Path], chans: int | None, size: int | None,
               shape: Sequence[int] | None) -> np.ndarray:
        """The images of table ``t`` (read from ``files``) as a ``(N, C, H, W)`` or ``(N, D)`` array."""
        col = t.column(self.image_column)
        label = f"{str(files[0])!r}" + (f" (+{len(files) - 1} files)" if len(files) > 1 else "")
        if self.encoded:
            return self._decoded(col, files, label, chans, size)
        if self.stored_meta is not None and pa.types.is_fixed_size_list(self.img_type):
            values = np.asarray(col.combine_chunks().flatten().to_numpy(zero_copy_only=False))
            return values.reshape((t.num_rows, *self.stored_meta.shape))
        if size is not None:
            raise _err("parquet", f"{label}: image_size resizes encoded images only; column {self.image_column!r} "
                                  f"holds raw {self.img_type} values")
        values, dims = _list_values(col, label)
        x = _raw_images(values, dims, shape, label)
        if np.issubdtype(x.dtype, np.integer):
            if x.size and (x.min() < 0 or x.max() > 255):
                raise _err("parquet", f"{label}: integer pixels lie in [{x.min()}, {x.max()}], expected 0..255")
            return x.astype(np.uint8)
        return x.astype(np.float32)

    def _decoded(self, col: pa.ChunkedArray, files: list[Path], label: str, chans: int | None,
                 size: int | None) -> np.ndarray:
        """Encoded images (``{bytes, path}`` structs or binary) decoded with Pillow."""
        arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        if pa.types.is_struct(self.img_type):
            fields = [self.img_type.field(i).name for i in range(self.img_type.num_fields)]
            if "bytes" not in fields:
                raise _err("parquet", f"{label}: image struct has fields {fields}, expected 'bytes' and 'path'")
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
                    raise _err("parquet", f"{label}: row {i} has no image bytes and its path {str(q)!r} does not exist")
                items.append(q)
            else:
                raise _err("parquet", f"{label}: row {i} has neither image bytes nor a path")
        if chans is None and items:
            from PIL import Image

            with Image.open(io.BytesIO(items[0]) if isinstance(items[0], bytes) else items[0]) as im:
                chans = 1 if im.mode in ("1", "L", "LA", "I", "I;16", "F") else 3
        names = [f"row {i} of {label}" for i in range(len(items))]
        return decode_images(items, chans or 3, size, names=names)

    def cached_images(self, fp: str, chans: int | None, size: int | None, shape: Sequence[int] | None,
                      cache: bool) -> dict[str, np.ndarray]:
        """``x_train`` (and ``x_test``) through the decoded-array cache (encoded images only)."""

        def build() -> dict[str, np.ndarray]:
            x_tr = self.images(self.train, self.tr_files, chans, size, shape)
            x_te = None
            if self.test is not None:
                x_te = self.images(self.test, self.te_files, chans or (x_tr.shape[1] if self.encoded else None),
                                   size, shape)
            out = {"x_train": x_tr}
            if x_te is not None:
                out["x_test"] = x_te
            return out

        def check(a: dict[str, np.ndarray]) -> bool:
            return a.get("x_train") is not None and a["x_train"].shape[0] == self.train.num_rows and (
                self.test is None or (a.get("x_test") is not None and a["x_test"].shape[0] == self.test.num_rows))

        return cached_arrays(f"parquet-{digest(fp, 24)}", build, cache and self.encoded, check)


def _parquet(root: Path | None, *, path, train_path, test_path, image_column, label_column, domain_column, classes,
             image_size, channels, shape, cache) -> DataBundle:
    """A generic image table. Encoded images (Hugging Face ``Image`` structs ``{bytes, path}`` or
    binary) are decoded with Pillow (to ``channels`` 1 or 3; default: 1 when the first image is
    greyscale, else 3) and resized to ``image_size`` when given; numeric lists are taken as they are
    (integers 0..255 -> uint8, floats -> float32). Class and domain names come from ``classes``,
    Hugging Face ``ClassLabel`` metadata, the sorted distinct strings of a string column, or 0..max."""
    src = "parquet"
    size = image_size
    wanted_classes = _as_names(src, "classes", classes)

    tr_files, te_files, base, where = _locate(root, path, train_path, test_path)
    tabs = _ParquetTables(tr_files, te_files, where, image_column, label_column, domain_column)
    tabs.check_nulls()
    class_names, to_labels = tabs.names_of(label_column, wanted_classes)
    domain_names, to_domains = tabs.names_of(domain_column, None) if domain_column else (None, None)

    sig = files_signature([*tr_files, *te_files], base)
    resolved = {"image_column": image_column, "label_column": label_column, "domain_column": domain_column,
                "classes": wanted_classes, "image_size": size, "channels": channels,
                "shape": list(shape) if shape is not None else None}
    fp = _fingerprint(src, "v1", resolved, [str(base.resolve()), sig])
    arrays = tabs.cached_images(fp, channels, size, shape, cache)
    x_tr = arrays["x_train"]
    y_tr = to_labels(tabs.train.column(label_column))
    d_tr = to_domains(tabs.train.column(domain_column)) if domain_column else None
    if tabs.test is not None:
        x_te = arrays["x_test"]
        if x_te.shape[1:] != x_tr.shape[1:]:
            raise _err(src, f"test images have shape {x_te.shape[1:]}, train images {x_tr.shape[1:]}; set image_size")
        y_te = to_labels(tabs.test.column(label_column))
        d_te = to_domains(tabs.test.column(domain_column)) if domain_column else None
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
