"""On-disk sources in their published layouts: CIFAR-10/100 pickles, MNIST / Fashion-MNIST IDX files,
Tiny-ImageNet and CINIC-10 image folders."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..formats import files_signature, load_pickle, read_idx, scan_class_folders
from ..table import DataBundle, DataError
from .common import _bundle, _decode_bundle, _err, _FileSplits, _fingerprint


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
# on-disk: image folders (Tiny-ImageNet, CINIC-10)

_TINY_LAYOUT = ("tiny-imagenet-200/{wnids.txt, words.txt (optional), train/<wnid>/images/*.JPEG, val/images/*.JPEG, "
                "val/val_annotations.txt}; root may be that folder or its parent")


def _tiny_imagenet(root: Path, *, image_size, cache) -> DataBundle:
    """Tiny-ImageNet: classes are the wnids of ``wnids.txt`` in sorted order (as an image-folder
    reader of ``train/`` numbers them); the labelled ``val`` split is the test split."""
    src = "tiny-imagenet"
    size = image_size
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
    size = image_size
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
