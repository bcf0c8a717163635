"""Partitioners: split the rows of a train split among ``num_clients`` virtual clients.

Every partitioner is a pure function of ``(labels, num_clients, seed, params)`` (plus the ``domains``
or ``natural`` column where it needs one): the same inputs give the same output on every machine.
:func:`partition_indices` is the single entry point; it validates the inputs, fills in defaults and
returns one **sorted** ``int64`` array of train-row indices per client, as a :class:`ClientIndex` (two flat
arrays, so ten million clients are not ten million Python objects).

Names and parameters follow Flower Datasets where an equivalent exists:

============================  =====================================================================
``iid``                       uniform random split, equal sizes (Flower ``IidPartitioner``)
``dirichlet``                 per-class Dirichlet label skew (Flower ``DirichletPartitioner``);
                              with default parameters identical to the benchmark workload
                              (``shared/bench/WORKLOAD.md`` §2)
``balanced_dirichlet``        FedRCL's equal-size Dirichlet label skew
``shards``                    class-sorted equal shards, ``shards_per_client`` per client
                              (FedAvg / FedRCL quantity skew, Flower ``ShardPartitioner``)
``classes_per_client``        each client holds ``classes`` classes (SCALA / NIID-Bench ``#C=k``,
                              Flower ``PathologicalPartitioner``)
``dirichlet_sizes``           client sizes from Dir(alpha) over clients, IID labels within
``domain``                    one or more clients per domain, balanced or Dirichlet sizes
``natural``                   one client per natural id (e.g. the synthetic source's ``client``)
============================  =====================================================================

Only ``dirichlet`` and ``dirichlet_sizes`` can produce empty clients, and only ``dirichlet`` accepts
more clients than samples. Partitioners that cannot give every sample to a client (equal-size ones
whose sizes do not divide the data) drop the remainder; each one documents which rows it drops.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedray.core.params import ParamSpec, check_params, check_value
from fedray.core.registry import Registry, RegistryError, caller_module, first_line, param_table, register_function

from .client_index import PASS_ROWS, ClientIndex, group_stable, label_stats, row_dtype, rows_by_class
from .draws import assign_cuts, class_sets, cuts_owner
from .table import DataError

__all__ = ["PARTITIONERS", "ClientIndex", "ParamSpec", "PartitionerSpec", "partition_indices", "canonical_params",
           "label_stats", "register_partitioner"]


# ----------------------------------------------------------------------------------------------
# registry types


@dataclass(frozen=True)
class PartitionerSpec:
    """A registered partitioner.

    ``fn(labels, num_clients, rng_seed, domains, natural, **params)`` (a list of per-client row arrays or a
    :class:`ClientIndex`) receives validated parameters with defaults filled in. ``allows_empty`` says whether
    the partitioner may return empty clients and accepts more clients than samples; ``needs`` names a per-row
    column (``"domains"`` or ``"natural"``) the partitioner requires.
    """

    name: str
    fn: Callable[..., Any]
    doc: str
    params: dict[str, ParamSpec] = field(default_factory=dict)
    allows_empty: bool = False
    needs: str | None = None

    def defaults(self) -> dict[str, Any]:
        return {k: p.default for k, p in self.params.items()}


# ----------------------------------------------------------------------------------------------
# parameter validation helpers


PARAMS_PATH = "data.partition.params"  # where the parameters live in an experiment config (named in errors)
_ALPHA = ParamSpec(None, "a concentration", float, gt=0)


def _err(name: str, msg: str) -> DataError:
    return DataError(f"partition {name!r}: {msg}")


def _positive_alpha(pname: str, value: Any, n: int | None = None, *, param: str = "alpha") -> np.ndarray | float:
    """A concentration: a positive finite scalar, or (when ``n`` is given) a vector of ``n`` of them."""
    if isinstance(value, (list, tuple, np.ndarray)):
        arr = np.asarray(value, dtype=np.float64)
        if n is None or arr.shape != (n,):
            raise _err(pname, f"{PARAMS_PATH}.{param}: must be a positive number"
                              f"{'' if n is None else f' or a list of {n} positive numbers'}, got {value!r}")
        if not np.all(np.isfinite(arr)) or np.any(arr <= 0):
            raise _err(pname, f"{PARAMS_PATH}.{param}: must be > 0 everywhere, got {value!r}")
        return arr
    return check_value(value, _ALPHA, f"{PARAMS_PATH}.{param}", lambda msg: _err(pname, msg))


# ----------------------------------------------------------------------------------------------
# shared building blocks


def _split_by_owner(owner: np.ndarray, num_clients: int) -> ClientIndex:
    """Turn a per-row owner array (-1 = unassigned) into the clients' sorted rows (:meth:`ClientIndex.from_owner`)."""
    return ClientIndex.from_owner(owner, num_clients)


def _check_min_size(pname: str, min_size: int, num_clients: int, m: int) -> None:
    if min_size * num_clients > m:
        raise _err(
            pname,
            f"min_partition_size={min_size} is impossible: {num_clients} clients x {min_size} > {m} samples",
        )


# ----------------------------------------------------------------------------------------------
# partitioners


def _iid(labels, num_clients, seed, domains, natural, *, remainder):
    """Uniform random split. Every client gets floor(M/N) rows; ``remainder='drop'`` leaves the
    M mod N rows at the end of the permutation unassigned, ``'spread'`` gives one of them to each of
    the first M mod N clients (sizes then differ by at most one, as Flower's ``IidPartitioner``)."""
    m = labels.shape[0]
    size, rest = divmod(m, num_clients)
    rest = rest if remainder == "spread" else 0
    offsets = np.arange(num_clients + 1, dtype=np.int64)
    offsets *= size
    offsets[:rest + 1] += np.arange(rest + 1)
    offsets[rest + 1:] += rest
    # client k: permutation positions offsets[k] .. offsets[k + 1], ascending (each run sorted in place, no owners)
    perm = np.arange(m, dtype=row_dtype(m))  # rng.permutation(m) draws the same shuffle for any dtype
    np.random.default_rng(seed).shuffle(perm)
    perm[:rest * (size + 1)].reshape(rest, size + 1).sort(axis=1)
    perm[rest * (size + 1):int(offsets[-1])].reshape(num_clients - rest, size).sort(axis=1)
    return ClientIndex(perm[:int(offsets[-1])], offsets)


def _dirichlet(labels, num_clients, seed, domains, natural, *, alpha, min_partition_size, self_balancing, max_attempts):
    """Classic per-class Dirichlet label skew (WORKLOAD.md §2 with the defaults).

    One ``np.random.default_rng(seed)``; for each class c = 0..max(label) in ascending order: shuffle
    the ascending positions of class c, draw p ~ Dir(alpha), cut at floor(cumsum(p) * n_c) (client k
    gets the k-th slice). ``self_balancing`` (Flower's meaning): before cutting a class, clients that
    already hold more than M/N rows get proportion 0 and the rest are renormalised.
    ``min_partition_size`` > 0 repeats the whole draw (the generator continues) until every client has
    at least that many rows, at most ``max_attempts`` times. Clients may be empty; every row is
    assigned to exactly one client.
    """
    m = labels.shape[0]
    rng = np.random.default_rng(seed)
    num_classes = int(labels.max()) + 1 if m else 0
    alpha_vec = alpha * np.ones(num_clients) if np.isscalar(alpha) else np.asarray(alpha, dtype=np.float64)
    by_class, class_off = group_stable(labels, num_classes)  # class c's rows, ascending: flatnonzero(labels == c)
    avg = m / num_clients
    for _attempt in range(max_attempts):
        owner = np.full(m, -1, dtype=row_dtype(num_clients))
        sizes = np.zeros(num_clients, dtype=np.int64)
        for c in range(num_classes):
            idx_c = by_class[class_off[c]:class_off[c + 1]].copy()  # rng.shuffle draws the same for any dtype
            rng.shuffle(idx_c)
            p = rng.dirichlet(alpha_vec)
            if self_balancing:
                p = np.where(sizes > avg, 0.0, p)
                total = p.sum()
                p = p / total if total > 0 else np.full(num_clients, 1.0 / num_clients)
            assign_cuts(owner, idx_c, p)
            if self_balancing:
                sizes += np.bincount(owner[idx_c], minlength=num_clients)
            del p, idx_c  # before the next class's draw: one num_clients-long p at a time, not two
        del sizes
        if min_partition_size <= 0:
            del by_class, alpha_vec  # not held through the sort of the owners
        parts = _split_by_owner(owner, num_clients)
        del owner
        if min_partition_size <= 0 or int(parts.sizes.min()) >= min_partition_size:
            return parts
    raise _err(
        "dirichlet",
        f"no draw in max_attempts={max_attempts} gave every client >= min_partition_size={min_partition_size} "
        f"rows (alpha={alpha!r}, {num_clients} clients, {m} rows); lower min_partition_size or raise alpha",
    )


def _balanced_dirichlet(labels, num_clients, seed, domains, natural, *, alpha):
    """FedRCL's balanced Dirichlet: every client gets exactly floor(M/N) rows.

    Clients are processed in turn (0, 1, ...). Client i draws class weights p ~ Dir(alpha * 1_C), then
    takes its rows one at a time without replacement among the still-unassigned rows, each row having
    weight p[label] (as ``torch.multinomial(weights, n, replacement=False)`` does in the reference code):
    a class is picked with probability proportional to p_c * remaining_c and then a uniformly random
    unassigned row of that class. When the classes with positive weight are exhausted the client
    continues uniformly over the remaining rows (weights renormalised over classes that still have
    rows). The M mod N rows left after the last client are unassigned.
    """
    m = labels.shape[0]
    rng = np.random.default_rng(seed)
    n = m // num_clients
    classes, inverse = np.unique(labels, return_inverse=True)
    k = classes.shape[0]
    # a uniformly shuffled queue of rows per class: popping from the front draws uniformly
    queues = [rng.permutation(np.flatnonzero(inverse == c)) for c in range(k)]
    heads = np.zeros(k, dtype=np.int64)
    remaining = np.array([q.shape[0] for q in queues], dtype=np.float64)
    owner = np.full(m, -1, dtype=np.int64)
    counts = np.zeros(k, dtype=np.int64)
    for i in range(num_clients):
        p = rng.dirichlet(alpha * np.ones(k))
        counts[:] = 0
        u = rng.random(n)
        for j in range(n):
            cw = np.cumsum(p * remaining)
            if not cw[-1] > 0:  # every weighted class is exhausted: uniform over what is left
                cw = np.cumsum(remaining)
            c = int(np.searchsorted(cw, u[j] * cw[-1], side="right"))
            c = min(c, k - 1)
            while remaining[c] == 0:  # guard against round-off landing on an empty class
                c = (c + 1) % k
            remaining[c] -= 1
            counts[c] += 1
        for c in np.flatnonzero(counts):
            take = queues[c][heads[c] : heads[c] + counts[c]]
            owner[take] = i
            heads[c] += counts[c]
    return _split_by_owner(owner, num_clients)


def _shards(labels, num_clients, seed, domains, natural, *, shards_per_client):
    """Quantity skew by class-sorted shards (FedAvg paper; FedRCL Table A with gamma = shards_per_client).

    The rows are sorted by class (random order within a class) and cut into gamma*N shards of
    floor(M / (gamma*N)) rows each; every client receives gamma distinct shards chosen at random, so it
    holds at most gamma classes (a shard can straddle two classes, giving one extra class now and then).
    The M mod (gamma*N) rows dropped to make the shards equal are chosen uniformly at random.
    """
    m = labels.shape[0]
    total_shards = shards_per_client * num_clients
    if total_shards > m:
        raise _err("shards", f"shards_per_client={shards_per_client} x {num_clients} clients = {total_shards} shards > {m} samples")
    rng = np.random.default_rng(seed)
    size = m // total_shards
    # rng.permutation(k) is np.arange(k) shuffled, and a shuffle draws the same for any dtype: int32 below 2^31
    perm = np.arange(m, dtype=row_dtype(m))
    rng.shuffle(perm)
    if int(labels.max()) < max(1 << 20, m):  # keep[argsort(labels[keep], kind="stable")] by a counting sort
        order = group_stable(labels, int(labels.max()) + 1, at=perm[: size * total_shards])[0]
    else:
        keep = perm[: size * total_shards]
        order = keep[np.argsort(labels[keep], kind="stable")]
    del perm
    shard_rows = order.reshape(total_shards, size)
    assign = np.arange(total_shards, dtype=row_dtype(total_shards))
    rng.shuffle(assign)
    per = shards_per_client * size  # client k holds shards assign[k * spc .. (k + 1) * spc], its rows ascending
    rows = np.empty(num_clients * per, dtype=row_dtype(len(labels)))
    step = max(1, PASS_ROWS // per)
    for lo in range(0, num_clients, step):
        hi = min(num_clients, lo + step)
        rows[lo * per:hi * per] = shard_rows[assign[lo * shards_per_client:hi * shards_per_client]].reshape(-1)
    del order, shard_rows, assign
    rows.reshape(num_clients, per).sort(axis=1)
    return ClientIndex(rows, np.arange(num_clients + 1, dtype=np.int64) * per)


def _classes_per_client(labels, num_clients, seed, domains, natural, *, classes, assignment):
    """Quantity-based label skew (SCALA, NIID-Bench ``#C=k``): each client holds ``classes`` classes.

    Class sets (over the classes present, in ascending order, indexed 0..C-1):
    ``first-deterministic`` (default): client i gets class i mod C plus ``classes - 1`` other distinct
    classes chosen at random, so every class is covered as soon as N >= C; ``deterministic``: classes
    i, i+1, ..., i+classes-1 (mod C); ``random``: a random set of ``classes`` distinct classes.
    Each class's rows are shuffled and split as evenly as possible (sizes differ by at most one) among
    the clients that hold it. Rows of a class no client holds (possible with ``random`` or N < C) are
    left unassigned.
    """
    m = labels.shape[0]
    uniq, by_class, class_off = rows_by_class(labels)  # class i's rows, ascending: flatnonzero(inverse == i)
    c_count = uniq.shape[0]
    if classes > c_count:
        raise _err("classes_per_client", f"classes={classes} exceeds the {c_count} classes present in the data")
    rng = np.random.default_rng(seed)
    sets = class_sets(rng, num_clients, c_count, classes, assignment)
    owner = np.full(m, -1, dtype=row_dtype(num_clients))
    for c in range(c_count):
        holders = np.flatnonzero((sets == c).any(axis=1))  # ascending client ids, as the per-client loop appended
        if not holders.size:
            continue
        rows = by_class[class_off[c]:class_off[c + 1]].copy()  # rng.permutation(rows) is a shuffled copy
        rng.shuffle(rows)
        base, rest = divmod(rows.shape[0], holders.size)
        sizes = np.full(holders.size, base, dtype=np.int64)
        sizes[:rest] += 1
        owner[rows] = np.repeat(holders, sizes)
    del by_class, sets, holders, rows, sizes  # not held through the sort of the owners
    return _split_by_owner(owner, num_clients)


def _dirichlet_sizes(labels, num_clients, seed, domains, natural, *, alpha, min_partition_size, max_attempts):
    """Imbalanced quantity: proportions q ~ Dir(alpha * 1_N) over clients, client k gets the k-th slice
    of a random permutation cut at floor(cumsum(q) * M) (labels IID within each client). Every row is
    assigned; clients may be empty unless ``min_partition_size`` > 0, which redraws q (the generator
    continues) up to ``max_attempts`` times."""
    m = labels.shape[0]
    rng = np.random.default_rng(seed)
    perm = rng.permutation(m)
    for _attempt in range(max_attempts):
        q = rng.dirichlet(alpha * np.ones(num_clients))
        own = cuts_owner(m, q)
        sizes = np.bincount(own, minlength=num_clients)
        if sizes.min() >= min_partition_size:
            owner = np.empty(m, dtype=np.int64)
            owner[perm] = own
            return _split_by_owner(owner, num_clients)
    raise _err(
        "dirichlet_sizes",
        f"no draw in max_attempts={max_attempts} gave every client >= min_partition_size={min_partition_size} rows "
        f"(alpha={alpha!r}, {num_clients} clients, {m} rows)",
    )


def _domain(labels, num_clients, seed, domains, natural, *, clients_per_domain, balance, alpha):
    """Inter-domain split: ``clients_per_domain`` clients per domain, domain-major order.

    Domains are the distinct values of the ``domain`` column in ascending order; client
    ``d * clients_per_domain + j`` draws only from domain d, and ``num_clients`` must equal
    D * clients_per_domain. Each domain's rows are shuffled and cut into ``clients_per_domain`` slots of
    a = floor(|D_d| / clients_per_domain) rows (the slot capacity of client k is a_k).
    ``balanced``: every client gets the same size s = min_k a_k (FedCCL's equal sizes); rows beyond it
    are unused. ``imbalanced``: sizes proportional to q ~ Dir(alpha * 1_N), scaled as large as the
    slot capacities allow (s_k = max(1, floor(q_k * min_j(a_j / q_j)))), so relative sizes follow the
    Dirichlet draw and the tightest client uses its whole slot.
    """
    dom_ids = np.unique(domains)
    d_count = dom_ids.shape[0]
    expected = d_count * clients_per_domain
    if num_clients != expected:
        raise _err(
            "domain",
            f"num_clients={num_clients} must equal {d_count} domains x clients_per_domain={clients_per_domain} = {expected}",
        )
    rng = np.random.default_rng(seed)
    slots: list[np.ndarray] = []
    for d in dom_ids:
        rows = rng.permutation(np.flatnonzero(domains == d))
        a = rows.shape[0] // clients_per_domain
        if a == 0:
            raise _err(
                "domain",
                f"domain {int(d)} has {rows.shape[0]} rows, fewer than clients_per_domain={clients_per_domain}",
            )
        for j in range(clients_per_domain):
            slots.append(rows[j * a : (j + 1) * a])
    cap = np.array([s.shape[0] for s in slots], dtype=np.int64)
    if balance == "balanced":
        sizes = np.full(num_clients, cap.min(), dtype=np.int64)
    else:
        q = rng.dirichlet(alpha * np.ones(num_clients))
        positive = q > 0
        scale = float(np.min(cap[positive] / q[positive]))
        sizes = np.clip(np.floor(q * scale).astype(np.int64), 1, cap)
    owner = np.full(labels.shape[0], -1, dtype=np.int64)
    for k, rows in enumerate(slots):
        owner[rows[: sizes[k]]] = k
    return _split_by_owner(owner, num_clients)


def _natural(labels, num_clients, seed, domains, natural, *, allow_fewer):
    """One client per natural id (e.g. the synthetic source's ``client`` column, a FEMNIST writer).

    Natural ids are taken in ascending order; client k holds every row of the k-th id. ``num_clients``
    must equal the number of natural ids, or be smaller when ``allow_fewer`` is true (the first N ids
    are used and the other rows are left out). The seed is not used.
    """
    m = natural.shape[0]
    if m > 1 and bool(np.all(natural[1:] >= natural[:-1])):  # ids in runs (the synthetic source): no sort
        breaks = np.flatnonzero(natural[1:] != natural[:-1])
        starts = np.empty(breaks.size + 2, dtype=np.int64)  # 0, every run's first row, m: no temporary of them
        starts[0], starts[-1] = 0, m
        np.add(breaks, 1, out=starts[1:-1])
        del breaks
        n_ids = starts.size - 1
        _check_natural(num_clients, n_ids, allow_fewer)
        return ClientIndex(np.arange(starts[num_clients], dtype=row_dtype(m)), starts[:num_clients + 1])
    ids, inverse = np.unique(natural, return_inverse=True)
    _check_natural(num_clients, ids.shape[0], allow_fewer)
    owner = np.where(inverse < num_clients, inverse, -1)
    return _split_by_owner(owner, num_clients)


def _check_natural(num_clients: int, n_ids: int, allow_fewer: bool) -> None:
    if num_clients > n_ids or (num_clients < n_ids and not allow_fewer):
        raise _err(
            "natural",
            f"num_clients={num_clients} but the data has {n_ids} natural clients"
            + ("" if num_clients > n_ids else "; set allow_fewer=true to use the first num_clients of them"),
        )


_ATTEMPTS = ParamSpec(100, "redraws allowed to satisfy min_partition_size before failing", int, ge=1)
_MIN_SIZE = ParamSpec(0, "redraw until every client has at least this many rows (0 = never)", int, ge=0)

PARTITIONERS: Registry[PartitionerSpec] = Registry("partitioner", "fedray.register_partitioner")


def register_partitioner(name: str, fn: Callable | None = None, *, description: str = "",
                         params: dict[str, ParamSpec] | None = None, allows_empty: bool = False,
                         needs: str | None = None, module: str | None = None):
    """Register ``fn(labels, num_clients, rng_seed, domains, natural, **params) -> list of row-index arrays`` (one
    per client) under ``name`` (``data.partition.name``); also a decorator. It runs in the driver (keep its module
    free of torch). A name another module registered is refused, naming both modules (:class:`PartitionerSpec`)."""
    table = param_table(params, f"register_partitioner({name!r})")
    if needs not in (None, "domains", "natural"):
        raise RegistryError(f"register_partitioner: needs must be None, 'domains' or 'natural', got {needs!r}")
    return register_function(PARTITIONERS, name, fn, module or caller_module(), "register_partitioner",
                             lambda f: PartitionerSpec(name, f, first_line(description, f), table, allows_empty, needs))


for _spec in [
    PartitionerSpec(
        "iid",
        _iid,
        _iid.__doc__,
        {"remainder": ParamSpec("drop", "'drop' (equal sizes floor(M/N)) or 'spread' (first M mod N clients get one more)",
                               choices=("drop", "spread"))},
    ),
    PartitionerSpec(
        "dirichlet",
        _dirichlet,
        _dirichlet.__doc__,
        {
            # a number or a list: checked by _positive_alpha
            "alpha": ParamSpec(0.3, "Dirichlet concentration (> 0), a number or one value per client"),
            "min_partition_size": _MIN_SIZE,
            "self_balancing": ParamSpec(False, "give proportion 0 to clients already holding more than M/N rows", bool),
            "max_attempts": _ATTEMPTS,
        },
        allows_empty=True,
    ),
    PartitionerSpec(
        "balanced_dirichlet",
        _balanced_dirichlet,
        _balanced_dirichlet.__doc__,
        {"alpha": ParamSpec(0.3, "Dirichlet concentration (> 0) of each client's class weights", float, gt=0)},
    ),
    PartitionerSpec(
        "shards",
        _shards,
        _shards.__doc__,
        {"shards_per_client": ParamSpec(2, "gamma: class-sorted shards per client", int, ge=1)},
    ),
    PartitionerSpec(
        "classes_per_client",
        _classes_per_client,
        _classes_per_client.__doc__,
        {
            "classes": ParamSpec(2, "alpha: number of classes each client holds", int, ge=1),
            "assignment": ParamSpec("first-deterministic", "'first-deterministic', 'deterministic' or 'random'",
                                    choices=("first-deterministic", "deterministic", "random")),
        },
    ),
    PartitionerSpec(
        "dirichlet_sizes",
        _dirichlet_sizes,
        _dirichlet_sizes.__doc__,
        {
            "alpha": ParamSpec(0.5, "Dirichlet concentration (> 0) over client sizes", float, gt=0),
            "min_partition_size": _MIN_SIZE,
            "max_attempts": _ATTEMPTS,
        },
    ),
    PartitionerSpec(
        "domain",
        _domain,
        _domain.__doc__,
        {
            "clients_per_domain": ParamSpec(1, "clients drawn from each domain", int, ge=1),
            "balance": ParamSpec("balanced", "'balanced' (equal sizes) or 'imbalanced' (Dirichlet sizes)",
                                 choices=("balanced", "imbalanced")),
            "alpha": ParamSpec(0.5, "Dirichlet concentration (> 0) of the imbalanced sizes", float, gt=0),
        },
        needs="domains",
    ),
    PartitionerSpec(
        "natural",
        _natural,
        _natural.__doc__,
        {"allow_fewer": ParamSpec(True, "accept num_clients below the number of natural ids (use the first N)", bool)},
        needs="natural",
    ),
]:
    PARTITIONERS.add(_spec.name, _spec, __name__)


def _validate_params(name: str, params: dict[str, Any], num_clients: int, m: int | None) -> dict[str, Any]:
    """Type/range checks for the parameters of partitioner ``name`` (defaults already merged), by the
    :class:`ParamSpec` table of the partitioner (plus ``dirichlet``'s per-client alpha vector).

    Returns the parameters coerced to canonical Python types (floats, ints, bools, strings, lists);
    the feasibility of ``min_partition_size`` is checked only when the number of rows ``m`` is given.
    """
    out = _check_given(name, params)
    if name == "dirichlet" and "alpha" in out:
        out["alpha"] = _positive_alpha(name, out["alpha"], num_clients)
    if "min_partition_size" in out and m is not None:
        _check_min_size(name, out["min_partition_size"], num_clients, m)
    return out


def _check_given(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Unknown keys and the values of ``params`` checked against partitioner ``name``'s table (no defaults)."""
    return check_params(params, PARTITIONERS[name].params, PARAMS_PATH, lambda msg: _err(name, msg), fill_defaults=False)


def canonical_params(name: str, params: dict[str, Any], *, num_clients: int) -> dict[str, Any]:
    """The full parameter set of partitioner ``name``: defaults merged with ``params``, validated and
    coerced to plain JSON types (so ``{"alpha": 1}`` and ``{}`` with default ``1.0`` compare equal).

    Raises :class:`DataError` for an unknown partitioner or parameter, or an invalid value.
    """
    if name not in PARTITIONERS:
        raise DataError(f"unknown partitioner {name!r}; known partitioners: {sorted(PARTITIONERS)}")
    spec = PARTITIONERS[name]
    _check_given(name, params)
    merged = spec.defaults()
    merged.update(params)
    out = _validate_params(name, merged, num_clients, None)
    return {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in sorted(out.items())}


def partition_indices(
    name: str,
    labels: np.ndarray,
    *,
    num_clients: int,
    seed: int,
    domains: np.ndarray | None = None,
    natural: np.ndarray | None = None,
    **params: Any,
) -> ClientIndex:
    """Split train rows among ``num_clients`` clients with partitioner ``name``.

    Returns a :class:`~fedray.data.client_index.ClientIndex`: a sequence of ``num_clients`` sorted, disjoint
    ``int64`` arrays of indices into ``labels`` (the train split), held as two flat arrays. Deterministic given ``(seed, params)``. Raises :class:`DataError` for an unknown
    partitioner (listing the known ones), an unknown parameter (naming it), ``num_clients < 1``, more
    clients than samples (except ``dirichlet``, which documents empty clients), invalid parameter
    values (``alpha <= 0`` ...) and a missing ``domains`` / ``natural`` column where one is needed.
    """
    if name not in PARTITIONERS:
        raise DataError(f"unknown partitioner {name!r}; known partitioners: {sorted(PARTITIONERS)}")
    spec = PARTITIONERS[name]
    _check_given(name, params)
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise _err(name, f"num_clients must be an integer >= 1, got {num_clients!r}")
    num_clients = int(num_clients)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise _err(name, f"seed must be a non-negative integer, got {seed!r}")
    seed = int(seed)
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise _err(name, f"labels must be a 1-D array, got shape {labels.shape}")
    if labels.size and not np.issubdtype(labels.dtype, np.integer):
        raise _err(name, f"labels must be integers, got dtype {labels.dtype}")
    labels = labels.astype(np.int64, copy=False)
    m = labels.shape[0]
    if m and labels.min() < 0:
        raise _err(name, f"labels must be >= 0, found {int(labels.min())}")
    if m == 0:
        raise _err(name, "the train split has no rows")
    if num_clients > m and not spec.allows_empty:
        raise _err(name, f"num_clients={num_clients} is more than the {m} samples of the train split")
    if spec.needs == "domains":
        if domains is None:
            raise _err(name, "needs a domain column, but the dataset has none (it is not a multi-domain dataset)")
        domains = np.asarray(domains)
        if domains.shape != (m,):
            raise _err(name, f"domains has shape {domains.shape}, expected ({m},)")
    if spec.needs == "natural":
        if natural is None:
            raise _err(name, "needs a natural client id per row (a 'client' column), but the dataset has none")
        natural = np.asarray(natural)
        if natural.shape != (m,):
            raise _err(name, f"natural client ids have shape {natural.shape}, expected ({m},)")
    merged = spec.defaults()
    merged.update(params)
    merged = _validate_params(name, merged, num_clients, m)
    parts = ClientIndex.from_parts(spec.fn(labels, num_clients, seed, domains, natural, **merged))
    if len(parts) != num_clients:
        raise _err(name, f"the partitioner returned {len(parts)} clients, not num_clients={num_clients}")
    return parts
