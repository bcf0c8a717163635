"""In-memory data (fedray/data/memory.py): ``fedray.data.from_arrays`` and ``from_hf`` build a bundle in fedray's
layout, register it as a source named by its content (again: a no-op), and refuse bad input naming the argument.
``from_hf`` is tested offline on small datasets built here (``datasets.Dataset.from_dict``)."""

from __future__ import annotations

import io

import numpy as np
import pytest

import fedray.data
from fedray.data.formats import stratified_split
from fedray.data.sources import SOURCES, load_source
from fedray.data.table import DataError


def _images(n=40, shape=(6, 5), seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, *shape), dtype=np.uint8), rng.integers(0, 4, n)


def test_layouts_and_dtypes_as_fedray_stores_them():
    x, y = _images(30, (7, 5, 3))  # HWC
    m = fedray.data.from_arrays(x[:20], y[:20], x[20:], y[20:])
    assert m.meta.shape == (3, 7, 5) and m.meta.dtype == "uint8" and (m.train_rows, m.test_rows) == (20, 10)
    assert np.array_equal(m.bundle.train.images(), x[:20].transpose(0, 3, 1, 2))
    grey = fedray.data.from_arrays(x[:20, :, :, 0], y[:20], x[20:, :, :, 0], y[20:])
    assert grey.meta.shape == (1, 7, 5) and np.array_equal(grey.bundle.test.images()[:, 0], x[20:, :, :, 0])
    chw = fedray.data.from_arrays(x[:20], y[:20], x[20:], y[20:], channels_last=False)
    assert chw.meta.shape == (7, 5, 3)
    vec = fedray.data.from_arrays(x[:20].reshape(20, -1) / 255.0, y[:20], x[20:].reshape(10, -1) / 255.0, y[20:])
    assert vec.meta.shape == (105,) and vec.meta.dtype == "float32"
    ints = fedray.data.from_arrays(x[:20].astype(np.int64), y[:20], x[20:].astype(np.int64), y[20:])
    assert ints.source == m.source  # integers in 0..255 are 8-bit images: the same content
    assert m.meta.num_classes == int(y.max()) + 1 and m.meta.classes == tuple(str(i) for i in range(4))


def test_labels_classes_domains_and_the_fixed_split():
    x, y = _images(50)
    names = np.array(["cat", "ant", "bee", "dog"])[y]
    m = fedray.data.from_arrays(x, names)  # no test split: the fixed stratified 80/20 split
    tr, te = stratified_split(np.searchsorted(["ant", "bee", "cat", "dog"], names), 0.2, 0)
    assert m.meta.classes == ("ant", "bee", "cat", "dog") and (m.train_rows, m.test_rows) == (len(tr), len(te))
    assert np.array_equal(m.bundle.test.images()[:, 0], x[te])
    ordered = fedray.data.from_arrays(x[:40], names[:40], x[40:], names[40:], classes=["dog", "cat", "bee", "ant"])
    assert np.array_equal(np.array(ordered.meta.classes)[ordered.bundle.train.labels], names[:40])
    with pytest.raises(DataError, match=r"labels \(y_train, y_test\): values \['ant'\] are not among the names given"):
        fedray.data.from_arrays(x, names, classes=["dog", "cat", "bee"])
    with pytest.raises(DataError, match=r"too few samples per class for the fixed 80/20 split.*give x_test, y_test"):
        fedray.data.from_arrays(x[:3], [0, 1, 2])
    named = fedray.data.from_arrays(x[:40], y[:40], x[40:], y[40:], classes=["a", "b", "c", "d", "e"])
    assert named.meta.num_classes == 5
    sites = np.array(["north", "south"])[np.arange(50) % 2]
    dom = fedray.data.from_arrays(x[:40], y[:40], x[40:], y[40:], domains=(sites[:40], sites[40:]))
    assert dom.meta.domains == ("north", "south") and list(dom.bundle.test.domains) == [0, 1] * 5


def test_the_source_is_named_by_content_and_registered_once():
    x, y = _images()
    m = fedray.data.from_arrays(x[:30], y[:30], x[30:], y[30:], name="toy set")
    assert m.source.startswith("memory-toy-set-") and m.fingerprint.startswith("memory:")
    count = len(SOURCES)
    again = fedray.data.from_arrays(x[:30].copy(), y[:30].copy(), x[30:], y[30:], name="toy set")
    assert again == m and len(SOURCES) == count and SOURCES.module(m.source) == "fedray.data.memory"
    b = load_source(m.source)
    assert b is m.bundle and b.fingerprint == m.fingerprint and b.meta.name == "toy set"
    x2 = x.copy()
    x2[-1, 0, 0] ^= 1  # one test pixel
    assert fedray.data.from_arrays(x[:30], y[:30], x2[30:], y[30:], name="toy set").source != m.source
    assert fedray.data.from_arrays(x[:30], y[:30], x[30:], y[30:], name="other").source != m.source
    assert "10 test" in repr(m) and "4 classes" in repr(m)


@pytest.mark.parametrize("args, kw, message", [
    (lambda x, y: (x, y[:-1], x, y), {}, r"y_train: 39 values for 40 samples"),
    (lambda x, y: (x, y, x[:5], y), {}, r"y_test: 40 values for 5 samples"),
    (lambda x, y: (x, y, x.astype(np.float32), y), {}, r"x_train is uint8 but x_test is float32: give both splits one "
                                                        r"dtype"),
    (lambda x, y: (x, y, x[:, :3], y), {}, r"x_train samples have shape \(6, 5\) but x_test samples \(3, 5\)"),
    (lambda x, y: (x, y.astype(float), x, y.astype(float)), {}, r"labels \(y_train, y_test\): dtype float64; expected "
                                                                r"integer ids or strings"),
    (lambda x, y: (x, y - 1, x, y), {}, r"labels \(y_train, y_test\): ids must be >= 0, found -1"),
    (lambda x, y: (x, y, x, y), {"classes": ["a", "b"]},
     r"labels \(y_train, y_test\): id 3 but only 2 names were given"),
    (lambda x, y: (x.astype(np.int32) * 2, y, x, y), {}, r"x_train: int32 values lie in \[0, 510\]"),
    (lambda x, y: (np.full(x.shape, np.nan), y, x / 1.0, y), {}, r"x_train: holds NaN or infinite values"),
    (lambda x, y: (x, y, x, None), {}, r"give both x_test and y_test, or neither"),
    (lambda x, y: (x[:0], y[:0], x, y), {}, r"x_train: no samples"),
    (lambda x, y: (x, y, x, y), {"domains": np.zeros(40)}, r"domains: expected a pair \(domains_train, domains_test\)"),
    (lambda x, y: (x, y, x, y), {"domains": (np.zeros(40, int), np.zeros(3, int))}, r"domains\[1\]: 3 values for 40"),
    (lambda x, y: (x.astype(bool), y, x.astype(bool), y), {}, r"x_train: dtype bool; expected uint8 images"),
    (lambda x, y: (x[0, 0], y, x, y), {}, r"x_train: expected an array of samples \(N, \.\.\.\)"),
])
def test_bad_arrays_are_refused_naming_the_argument(args, kw, message):
    x, y = _images()
    with pytest.raises(DataError, match=message):
        fedray.data.from_arrays(*args(x, y), **kw)


# ------------------------------------------------------------------------------------------- from_hf
datasets = pytest.importorskip("datasets")


def _png(a: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(a).save(buf, format="PNG")
    return buf.getvalue()


def _hf(x: np.ndarray, y, **extra):
    feats = {"img": datasets.Image(), "label": datasets.ClassLabel(names=["zero", "one", "two", "three"])}
    feats.update({k: datasets.Value("string") for k in extra})
    return datasets.Dataset.from_dict({"img": [{"bytes": _png(a), "path": None} for a in x],
                                       "label": [int(v) for v in y], **extra}, features=datasets.Features(feats))


def test_from_hf_decodes_image_features_and_keeps_class_labels():
    x, y = _images(30, (8, 8))
    dd = datasets.DatasetDict(train=_hf(x[:20], y[:20]), validation=_hf(x[20:], y[20:]))
    m = fedray.data.from_hf(dd, image_column="img", name="toy")
    assert m.meta.classes == ("zero", "one", "two", "three") and m.meta.shape == (1, 8, 8)
    assert (m.train_rows, m.test_rows) == (20, 10)  # validation is the test split when there is no test
    assert np.array_equal(m.bundle.train.images()[:, 0], x[:20]) and np.array_equal(m.bundle.test.labels, y[20:])
    # the same pixels and labels as arrays: the same source
    assert fedray.data.from_arrays(x[:20], y[:20], x[20:], y[20:], name="toy",
                                   classes=["zero", "one", "two", "three"]).source == m.source
    rgb = fedray.data.from_hf(dd, image_column="img", channels=3, image_size=4)
    assert rgb.meta.shape == (3, 4, 4)
    rows = [int(i) for i in np.random.default_rng(1).permutation(20)[:15]]
    picked = fedray.data.from_hf(dd["train"].select(rows), image_column="img", name="picked")  # selections apply
    assert picked.source == fedray.data.from_arrays(x[rows], y[rows], name="picked",
                                                    classes=["zero", "one", "two", "three"]).source


def test_from_hf_arrays_strings_and_domains():
    x, y = _images(40, (6, 6, 3))
    names = np.array(["b", "a", "c", "d"])[y]
    sites = ["s1" if i % 3 else "s0" for i in range(40)]
    ds = datasets.Dataset.from_dict({"image": [a for a in x], "label": names.tolist(), "site": sites})
    m = fedray.data.from_hf(ds, domain_column="site")  # one Dataset: the fixed 80/20 split
    ref = fedray.data.from_arrays(x, names, domains=np.array(sites), name="hf")
    assert m.source == ref.source and m.meta.shape == (3, 6, 6) and m.meta.classes == ("a", "b", "c", "d")
    assert m.meta.domains == ("s0", "s1")
    arr = datasets.Dataset.from_dict({"image": [a for a in x.transpose(0, 3, 1, 2)], "label": y.tolist()},
                                     features=datasets.Features({"image": datasets.Array3D((3, 6, 6), "uint8"),
                                                                 "label": datasets.Value("int64")}))
    assert fedray.data.from_hf(arr).meta.shape == (3, 6, 6)


def test_from_hf_bad_input_names_what_is_wrong():
    x, y = _images(10, (4, 4))
    dd = datasets.DatasetDict(train=_hf(x, y), test=_hf(x, y))
    with pytest.raises(DataError, match=r"the Dataset has no column\(s\) \['image'\] \(columns: \['img', 'label'\]\)"):
        fedray.data.from_hf(dd["train"])
    with pytest.raises(DataError, match=r"no split 'training' \(splits: \['train', 'test'\]\); set train_split"):
        fedray.data.from_hf(dd, train_split="training", image_column="img")
    with pytest.raises(DataError, match=r"no split 'dev'"):
        fedray.data.from_hf(dd, test_split="dev", image_column="img")
    with pytest.raises(DataError, match="expected a datasets.Dataset or DatasetDict, got list"):
        fedray.data.from_hf([1, 2])
    with pytest.raises(DataError, match="channels must be 1, 3 or None"):
        fedray.data.from_hf(dd, image_column="img", channels=2)
