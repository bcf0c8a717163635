"""In-memory data for notebooks and scripts: :func:`from_arrays` (numpy arrays) and :func:`from_hf` (a Hugging Face
``datasets.Dataset`` / ``DatasetDict``), as ``fedray.data.from_arrays`` / ``fedray.data.from_hf`` (docs/python-api.md).

Each builds the :class:`~fedray.data.table.DataBundle` at once (every check made here, before any run), fingerprints
it by its content (:func:`~fedray.data.spec_hash.content_fingerprint` of both splits) and registers it as a data
source of this process whose name carries that fingerprint (``memory-<name>-<12 hex>``), through
``fedray.register_source``. Registering the same content again is a no-op, so a notebook cell can run twice. A
config chooses the data by that name (``data.source``, or ``fedray.run(..., data=<the returned object>)``), so the
run's config hash, its run directory and the partition cache all key on the data's content, never on an object's
identity. The source runs in the driver only, as every source does: the driver partitions the data into packed files
and the client workers (Ray actors included) read those, so in-memory data works on Ray as on the local backend.

The arrays stay in this process's memory (the registry holds them) until it exits; a later process, e.g.
``fedray run --resume`` from a shell, does not know the source: resume such a run with ``fedray.run(resume=...)``
after the same ``from_arrays`` call.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .table import DataBundle, DataError, DatasetMeta

__all__ = ["InMemoryData", "SOURCE_PREFIX", "from_arrays", "from_hf"]

SOURCE_PREFIX = "memory"
#: source name -> bundle, for the sources registered by this module (what their loader returns)
_BUNDLES: dict[str, DataBundle] = {}


@dataclass(frozen=True)
class InMemoryData:
    """Data registered by :func:`from_arrays` / :func:`from_hf`: ``source`` is the ``data.source`` name that chooses
    it; pass the object itself as ``fedray.run(..., data=obj)``."""

    source: str
    fingerprint: str
    meta: DatasetMeta
    train_rows: int
    test_rows: int

    @property
    def bundle(self) -> DataBundle:
        return _BUNDLES[self.source]

    def config(self) -> dict:
        """The ``data`` fields that choose this data (a config's ``data:`` section keeps its partition)."""
        return {"source": self.source, "root": None, "params": {}}

    def __repr__(self) -> str:
        return (f"InMemoryData({self.source!r}: {self.train_rows} train / {self.test_rows} test, shape "
                f"{self.meta.shape} {self.meta.dtype}, {self.meta.num_classes} classes"
                + (f", domains {list(self.meta.domains)}" if self.meta.domains else "") + ")")


# ------------------------------------------------------------------------------------------- checks
def _images(x: Any, what: str) -> np.ndarray:
    """``x`` as uint8 (8-bit images: uint8, or integers within 0..255) or float32 (floating point, finite)."""
    x = np.asarray(x)
    if x.ndim < 2:
        raise DataError(f"{what}: expected an array of samples (N, ...) with N rows, got shape {x.shape}")
    if x.dtype == np.uint8:
        return x
    if np.issubdtype(x.dtype, np.integer):
        if x.size and (x.min() < 0 or x.max() > 255):
            raise DataError(f"{what}: {x.dtype} values lie in [{x.min()}, {x.max()}]; integer images must be 8-bit "
                            f"(0..255), else give floating-point values")
        return x.astype(np.uint8)
    if np.issubdtype(x.dtype, np.floating):
        x = x.astype(np.float32, copy=False)
        if not np.isfinite(x).all():
            raise DataError(f"{what}: holds NaN or infinite values")
        return x
    raise DataError(f"{what}: dtype {x.dtype}; expected uint8 images (or integers in 0..255) or floating-point "
                    f"values")


def _chw(x: np.ndarray, channels_last: bool | None) -> np.ndarray:
    """Samples as fedray stores them: (N, D) vectors, (N, H, W) -> (N, 1, H, W), (N, H, W, C) -> (N, C, H, W) when
    ``channels_last`` (default: when the last axis has 1, 3 or 4 entries and the first one does not)."""
    if x.ndim == 3:
        return x[:, None]
    if x.ndim == 4:
        last = channels_last if channels_last is not None else (x.shape[3] in (1, 3, 4) and x.shape[1] not in (1, 3, 4))
        return np.ascontiguousarray(x.transpose(0, 3, 1, 2)) if last else x
    return x


def _names(values: list[np.ndarray], given: Sequence[str] | None, what: str) -> tuple[list[np.ndarray], list[str]]:
    """Class (or domain) ids of every split and their names: integer ids (names ``given`` or ``0..max``) or strings
    (ids in the order of ``given``, else sorted)."""
    given = None if given is None else [str(c) for c in given]
    if given is not None and len(set(given)) != len(given):
        raise DataError(f"{what} names list a name more than once: {given}")
    if all(v.dtype.kind in "iu" for v in values):
        lo = min((int(v.min()) for v in values if v.size), default=0)
        hi = max((int(v.max()) for v in values if v.size), default=-1)
        if lo < 0:
            raise DataError(f"{what}: ids must be >= 0, found {lo}")
        if given is not None and hi >= len(given):
            raise DataError(f"{what}: id {hi} but only {len(given)} names were given")
        return [v.astype(np.int64) for v in values], given or [str(i) for i in range(hi + 1)]
    if all(v.dtype.kind in "USO" for v in values):
        found = sorted({str(s) for v in values for s in v.tolist()})
        names = given or found
        lookup = {n: i for i, n in enumerate(names)}
        unknown = [s for s in found if s not in lookup]
        if unknown:
            raise DataError(f"{what}: values {unknown[:5]} are not among the names given ({names})")
        return [np.asarray([lookup[str(s)] for s in v.tolist()], dtype=np.int64) for v in values], names
    kinds = sorted({str(v.dtype) for v in values})
    raise DataError(f"{what}: dtype {', '.join(kinds)}; expected integer ids or strings (the same kind in both splits)")


def _ids(y: Any, n: int, what: str) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1:
        raise DataError(f"{what}: expected one value per sample (shape ({n},)), got shape {y.shape}")
    if y.shape[0] != n:
        raise DataError(f"{what}: {y.shape[0]} values for {n} samples")
    return y


def _checked_splits(x_train, y_train, x_test, y_test, domains):
    """Every check of :func:`from_arrays`' inputs that does not need the class names: the arrays, one per split."""
    if (x_test is None) != (y_test is None):
        raise DataError("from_arrays: give both x_test and y_test, or neither (a fixed 80/20 split of the train data)")
    xs = [_images(x_train, "x_train")] + ([_images(x_test, "x_test")] if x_test is not None else [])
    if xs[0].shape[0] == 0:
        raise DataError("x_train: no samples")
    if len(xs) == 2:
        if xs[1].shape[0] == 0:
            raise DataError("x_test: no samples (give x_test=None, y_test=None for a fixed 80/20 split)")
        if xs[0].dtype != xs[1].dtype:
            raise DataError(f"x_train is {xs[0].dtype} but x_test is {xs[1].dtype}: give both splits one dtype "
                            f"(uint8 images, or floating-point values)")
        if xs[0].shape[1:] != xs[1].shape[1:]:
            raise DataError(f"x_train samples have shape {xs[0].shape[1:]} but x_test samples {xs[1].shape[1:]}")
    ys = [_ids(y_train, xs[0].shape[0], "y_train")] + ([_ids(y_test, xs[1].shape[0], "y_test")] if len(xs) == 2 else [])
    ds = None
    if domains is not None:
        if len(xs) == 2 and (not isinstance(domains, (tuple, list)) or len(domains) != 2):
            raise DataError("domains: expected a pair (domains_train, domains_test) of per-sample domain ids or names")
        parts = domains if len(xs) == 2 else [domains]
        ds = [_ids(d, x.shape[0], f"domains[{i}]" if len(xs) == 2 else "domains") for i, (d, x) in
              enumerate(zip(parts, xs))]
    return xs, ys, ds


def _combined(bundle: DataBundle) -> str:
    from .spec_hash import content_fingerprint

    h = hashlib.sha256()
    for split in (bundle.train, bundle.test):
        h.update(content_fingerprint(split).encode() + b"\0")
    return f"{SOURCE_PREFIX}:" + h.hexdigest()[:32]


# ------------------------------------------------------------------------------------------- from_arrays
def from_arrays(x_train, y_train, x_test=None, y_test=None, *, name: str | None = None,
                classes: Sequence[str] | None = None, domains=None, domain_names: Sequence[str] | None = None,
                channels_last: bool | None = None) -> InMemoryData:
    """Register arrays as a data source of this process; the :class:`InMemoryData` that names it.

    ``x_*``: samples, ``(N, H, W)`` grey images, ``(N, C, H, W)`` or ``(N, H, W, C)`` images (``channels_last``
    decides; default: a last axis of 1, 3 or 4 entries when the second has not), or ``(N, D)`` vectors; uint8 (or
    integers in 0..255) stay 8-bit, floating point is stored as float32. ``y_*``: class ids (integers) or class
    names (strings). ``x_test=None, y_test=None``: a fixed, stratified 80/20 split of the train arrays (the rule of
    the sources without a test split). ``classes``: class names in id order (for string labels: the order).
    ``domains``: ``(domains_train, domains_test)`` (without a test split: one array), per-sample domain ids or
    names, for the inter-domain setting;
    ``domain_names`` names integer ids. ``name``: the dataset's name (in the source name and logs; default
    ``arrays``). Bad input raises :class:`~fedray.data.table.DataError` naming the argument."""
    from .formats import stratified_split
    from .sources.common import SPLIT_SEED, TEST_FRACTION, _bundle

    xs, ys, ds = _checked_splits(x_train, y_train, x_test, y_test, domains)
    ys, class_names = _names(ys, classes, "labels (y_train, y_test)")
    d_names: list[str] = []
    if ds is not None:
        ds, d_names = _names(ds, domain_names, "domains")
    xs = [_chw(x, channels_last) for x in xs]
    if len(xs) == 1:  # no test split given: the fixed stratified split (per domain and class)
        key = ys[0] if ds is None else ds[0] * len(class_names) + ys[0]
        tr, te = stratified_split(key, TEST_FRACTION, SPLIT_SEED)
        if len(te) == 0:
            raise DataError(f"from_arrays: too few samples per class for the fixed 80/20 split ({len(tr)} samples, no "
                            f"class with two); give x_test, y_test")
        xs, ys = [xs[0][tr], xs[0][te]], [ys[0][tr], ys[0][te]]
        ds = None if ds is None else [ds[0][tr], ds[0][te]]
    label = str(name) if name else "arrays"
    bundle = _bundle(label, xs[0], ys[0], xs[1], ys[1], class_names, "", domains=d_names,
                     d_train=None if ds is None else ds[0], d_test=None if ds is None else ds[1],
                     info={"source": "in-memory arrays"})
    return register(bundle, label)


def register(bundle: DataBundle, name: str) -> InMemoryData:
    """Fingerprint ``bundle`` by content and register it as the source ``memory-<name>-<12 hex>`` of this process
    (again: a no-op); the :class:`InMemoryData` naming it."""
    from .sources import register_source

    bundle.fingerprint = _combined(bundle)
    slug = re.sub(r"[^A-Za-z0-9_.]+", "-", name).strip("-") or "arrays"
    source = f"{SOURCE_PREFIX}-{slug}-{bundle.fingerprint.split(':', 1)[1][:12]}"
    bundle.info = {**bundle.info, "source": source}
    if source not in _BUNDLES:
        _BUNDLES[source] = bundle
        register_source(source, lambda root: _BUNDLES[source],
                        description=f"in-memory data {name!r} (fedray.data; {len(bundle.train)} train / "
                                    f"{len(bundle.test)} test rows)", module=__name__)
    return InMemoryData(source, bundle.fingerprint, bundle.meta, len(bundle.train), len(bundle.test))


# ------------------------------------------------------------------------------------------- from_hf
_TEST_SPLITS = ("test", "validation", "valid", "val")


def _hf_splits(dataset, train_split: str, test_split: str | None) -> tuple[Any, Any, str]:
    """(train, test or None, label) of a ``Dataset`` or ``DatasetDict``."""
    if hasattr(dataset, "with_format") and not isinstance(dataset, dict):
        if test_split is not None:
            raise DataError("from_hf: test_split names a split of a DatasetDict; this is one Dataset")
        return dataset, None, "the Dataset"
    if not isinstance(dataset, dict):
        raise DataError(f"from_hf: expected a datasets.Dataset or DatasetDict, got {type(dataset).__name__} (an "
                        f"IterableDataset must be materialised first, e.g. Dataset.from_generator)")
    splits = list(dataset)
    if train_split not in dataset:
        raise DataError(f"from_hf: no split {train_split!r} (splits: {splits}); set train_split")
    if test_split is not None and test_split not in dataset:
        raise DataError(f"from_hf: no split {test_split!r} (splits: {splits}); set test_split")
    test = test_split or next((s for s in _TEST_SPLITS if s in dataset), None)
    return dataset[train_split], (dataset[test] if test else None), f"split {train_split!r}"


def _hf_table(ds, columns: list[str], label: str):
    """The ``columns`` of a Dataset as one Arrow table (row selections applied; extension arrays as their storage)."""
    import pyarrow as pa

    have = list(ds.column_names)
    missing = [c for c in columns if c not in have]
    if missing:
        raise DataError(f"from_hf: {label} has no column(s) {missing} (columns: {have}); set image_column / "
                        f"label_column / domain_column")
    table = ds.with_format("arrow", columns=columns)[:]
    for i, col in enumerate(table.columns):
        if isinstance(col.type, pa.ExtensionType):  # Array2D / Array3D features: nested lists underneath
            table = table.set_column(i, table.field(i).name, pa.chunked_array([c.storage for c in col.chunks]))
    return table


def from_hf(dataset, *, image_column: str = "image", label_column: str = "label", domain_column: str | None = None,
            train_split: str = "train", test_split: str | None = None, classes: Sequence[str] | None = None,
            image_size: int | None = None, channels: int | None = None, shape: Sequence[int] | None = None,
            name: str | None = None) -> InMemoryData:
    """Register a Hugging Face ``datasets.Dataset`` or ``DatasetDict`` (Arrow tables already) as a data source of
    this process, as :func:`from_arrays` does; nothing is downloaded.

    A ``DatasetDict`` gives its ``train_split`` and ``test_split`` (default: the first of test, validation, valid,
    val it has; none: a fixed stratified 80/20 split of the train split, as for a single ``Dataset``).
    ``image_column``: ``Image`` features (encoded bytes or file paths, decoded with Pillow to ``channels`` 1 or 3,
    default as the first image, and resized to ``image_size``) or numeric arrays / lists (``shape`` gives the CHW
    shape of flat ones). ``label_column``: a ``ClassLabel`` (its names are the classes), integers or strings;
    ``domain_column`` likewise. These are the ``parquet`` source's rules: ``datasets → to_parquet → data.source:
    parquet`` reads the same data from files."""
    from .sources.parquet import _ParquetTables

    if channels not in (None, 1, 3):
        raise DataError(f"from_hf: channels must be 1, 3 or None, got {channels!r}")
    train, test, label = _hf_splits(dataset, train_split, test_split)
    cols = [image_column, label_column] + ([domain_column] if domain_column else [])
    t_train = _hf_table(train, cols, label)
    t_test = _hf_table(test, cols, "the test split") if test is not None else None
    tabs = _ParquetTables.of_tables(t_train, t_test, f"<Hugging Face {label}>", image_column, label_column,
                                    domain_column)
    tabs.check_nulls()
    class_names, to_labels = tabs.names_of(label_column, None if classes is None else [str(c) for c in classes])
    d_names, to_domains = tabs.names_of(domain_column, None) if domain_column else (None, None)
    x_tr = tabs.images(t_train, tabs.tr_files, channels, image_size, shape)
    xs, ys = [x_tr], [to_labels(t_train.column(label_column))]
    ds = [to_domains(t_train.column(domain_column))] if domain_column else None
    if t_test is not None:
        xs.append(tabs.images(t_test, tabs.te_files, channels or (x_tr.shape[1] if tabs.encoded else None),
                              image_size, shape))
        ys.append(to_labels(t_test.column(label_column)))
        if ds is not None:
            ds.append(to_domains(t_test.column(domain_column)))
    if ds is not None and len(ds) == 1:
        ds = ds[0]
    name = name or getattr(getattr(train, "info", None), "dataset_name", None) or "hf"
    return from_arrays(xs[0], ys[0], *(xs[1:] + ys[1:] if len(xs) == 2 else [None, None]), classes=class_names,
                       domains=ds, domain_names=d_names, name=name, channels_last=False)
