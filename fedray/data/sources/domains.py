"""Multi-domain sources: the offline ``digits-domains`` synthesis and the ``digit5`` / ``office10`` /
``domainnet`` image folders per domain."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..formats import is_image_file, resize_bilinear, scan_class_folders, stratified_split, stratified_subset
from ..table import DataBundle
from .common import (
    SPLIT_SEED,
    TEST_FRACTION,
    _as_names,
    _bundle,
    _decode_bundle,
    _err,
    _FileSplits,
    _fingerprint,
)
from .embedded import _digits_images, _mnist5k_arrays


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
    cap = max_per_domain

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
# on-disk: image folders per domain

_DOMAIN_LAYOUT = ("root/<domain>/<class>/*.{png,jpg,jpeg} (a fixed stratified 80/20 split is made) or "
                  "root/<domain>/train/<class>/... with root/<domain>/test/<class>/... (or val/)")
_DIGIT5_LAYOUT = ("either Dassl.pytorch's tree root/<domain>/train_images/<n>_<label>.jpg with "
                  "root/<domain>/test_images/<n>_<label>.jpg (labels from the file names, its train/test split), "
                  f"or the class-folder tree {_DOMAIN_LAYOUT}")
_DOMAINNET_LAYOUT = ("the official lists root/<domain>_train.txt and root/<domain>_test.txt (lines '<domain>/<class>/"
                     f"<file>.jpg <label>', paths relative to root) when present, else the class-folder tree {_DOMAIN_LAYOUT}")
LAYOUTS = {"digit5": _DIGIT5_LAYOUT, "domainnet": _DOMAINNET_LAYOUT}
_DASSL_SPLITS = ("train_images", "test_images")
_DASSL_NAME = re.compile(r"^\d+_(\d+)\.[A-Za-z]+$")

Folders = dict[str, list[Path]]


def _dassl_digit5(src: str, d: Path) -> tuple[Folders, Folders]:
    """Dassl.pytorch's Digit-5 domain folder: ``train_images/`` and ``test_images/`` holding ``<n>_<label>.<ext>``
    files. Returns ``{label: files}`` per split (label names are the decimal labels)."""
    out = []
    for split in _DASSL_SPLITS:
        folder = d / split
        if not folder.is_dir():
            raise _err(src, f"{str(d)!r} has {'/'.join(p for p in _DASSL_SPLITS if (d / p).is_dir())}/ but not "
                            f"{split}/; expected {_DIGIT5_LAYOUT}")
        by_label: Folders = {}
        for f in sorted(p for p in folder.iterdir() if p.is_file() and is_image_file(p)):
            m = _DASSL_NAME.match(f.name)
            if m is None:
                raise _err(src, f"image {str(f)!r} is not named <n>_<label>.<ext>; expected {_DIGIT5_LAYOUT}")
            by_label.setdefault(str(int(m.group(1))), []).append(f)
        if not by_label:
            raise _err(src, f"no <n>_<label> images in {str(folder)!r}; expected {_DIGIT5_LAYOUT}")
        out.append(dict(sorted(by_label.items(), key=lambda kv: int(kv[0]))))
    return out[0], out[1]


def _list_file(root: Path, domain: str, split: str) -> Path | None:
    f = root / f"{domain}_{split}.txt"
    return f if f.is_file() else None


def _domainnet_lists(src: str, root: Path, domain: str, labels: dict[str, int]) -> tuple[Folders, Folders]:
    """The official DomainNet split lists of one domain: ``{class: files}`` per split. ``labels`` (class name ->
    the lists' label, shared over domains) checks that a class keeps one label everywhere."""
    out = []
    for split in ("train", "test"):
        lst = _list_file(root, domain, split)
        if lst is None:
            raise _err(src, f"{str(root / f'{domain}_train.txt')!r} and {str(root / f'{domain}_test.txt')!r} must "
                            f"both exist; expected {_DOMAINNET_LAYOUT}")
        by_class: Folders = {}
        for n, line in enumerate(lst.read_text().splitlines(), 1):
            if not line.strip():
                continue
            parts = line.split()
            rel = Path(parts[0]) if parts else Path()
            if len(parts) != 2 or not parts[1].lstrip("-").isdigit() or len(rel.parts) < 2:
                raise _err(src, f"{str(lst)!r} line {n}: expected '<domain>/<class>/<file> <label>', got {line!r}")
            f = root / rel
            if not f.is_file():
                raise _err(src, f"{str(lst)!r} line {n} names {str(f)!r}, which does not exist")
            cls, lab = rel.parts[-2], int(parts[1])
            if labels.setdefault(cls, lab) != lab:
                raise _err(src, f"{str(lst)!r} line {n}: class {cls!r} has label {lab}, elsewhere {labels[cls]}")
            by_class.setdefault(cls, []).append(f)
        out.append({c: sorted(fs) for c, fs in sorted(by_class.items())})
    return out[0], out[1]


def _class_folder_domain(src: str, d: Path) -> tuple[Folders, Folders | None]:
    """``<domain>/<class>/*`` (no split) or ``<domain>/train/<class>/*`` with ``test/`` (or ``val/``)."""
    layout = LAYOUTS.get(src, _DOMAIN_LAYOUT)
    if (d / "train").is_dir():
        test_dir = next((d / t for t in ("test", "val") if (d / t).is_dir()), None)
        if test_dir is None:
            raise _err(src, f"{str(d / 'train')!r} exists but neither {str(d / 'test')!r} nor val/ does; "
                            f"expected {layout}")
        return scan_class_folders(d / "train"), scan_class_folders(test_dir)
    loose = [p.name for p in d.iterdir() if p.is_file() and is_image_file(p)]
    folders = scan_class_folders(d)
    if loose or not any(folders.values()):
        what = f"images directly in it ({', '.join(sorted(loose)[:3])}, ...)" if loose else "no class folder with images"
        raise _err(src, f"domain folder {str(d)!r} has {what}; expected {layout}")
    return folders, None


def _domain_folders(src: str, root: Path, *, domains, classes, image_size, max_per_domain, cache) -> DataBundle:
    """Shared loader of the image-folder domain datasets (Digit-5, Office-10, DomainNet).

    Per domain: Digit-5 also reads Dassl.pytorch's ``train_images/<n>_<label>`` layout, DomainNet the official
    ``<domain>_train.txt`` / ``<domain>_test.txt`` lists when both exist; otherwise class folders."""
    size, cap = image_size, max_per_domain
    wanted = _as_names(src, "classes", classes)
    layout = LAYOUTS.get(src, _DOMAIN_LAYOUT)
    available = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    names = _as_names(src, "domains", domains) or available
    missing = [d for d in names if d not in available]
    if missing or not names:
        raise _err(src, f"domain folder(s) {missing or '(none)'} not found in {str(root)!r} (found: {available}); "
                        f"expected {layout}")
    per_domain = []
    kinds = set()
    list_labels: dict[str, int] = {}
    for dname in names:
        d = root / dname
        if src == "digit5" and any((d / p).is_dir() for p in _DASSL_SPLITS):
            per_domain.append(_dassl_digit5(src, d))
            kinds.add("dassl")
        elif src == "domainnet" and (_list_file(root, dname, "train") or _list_file(root, dname, "test")):
            per_domain.append(_domainnet_lists(src, root, dname, list_labels))
            kinds.add("lists")
        else:
            per_domain.append(_class_folder_domain(src, d))
            kinds.add("folders")
    found = sorted({c for tr, te in per_domain for part in (tr, te or {}) for c, fs in part.items() if fs},
                   key=lambda c: (list_labels.get(c, int(c) if "dassl" in kinds and c.isdigit() else -1), c))
    if wanted is not None:
        absent = [c for c in wanted if c not in found]
        if absent:
            raise _err(src, f"class folder(s) {absent} not found in any domain under {str(root)!r} (found: {found})")
    class_names = wanted or found
    if not class_names:
        raise _err(src, f"no images found under {str(root)!r}; expected {layout}")
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
    if kinds != {"folders"}:  # the labels come from file names or lists: part of the identity of the data
        resolved["layouts"] = sorted(kinds)
    if "lists" in kinds:  # which file is train or test, and its label, live in the lists
        lists = [f for d in names for sp in ("train", "test") if (f := _list_file(root, d, sp)) is not None]
        resolved["lists_sha1"] = hashlib.sha1(b"".join(f.read_bytes() for f in lists)).hexdigest()
    return _decode_bundle(src, root, files, class_names, size, resolved, cache, domains=names)


def _domain_source(src: str) -> Callable[..., DataBundle]:
    def load(root: Path, **params) -> DataBundle:
        return _domain_folders(src, root, **params)

    load.__name__ = f"_{src}"
    load.__doc__ = f"{src}: image folders per domain ({LAYOUTS.get(src, _DOMAIN_LAYOUT)})."
    return load
