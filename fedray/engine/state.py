"""Per-client state kept outside the workers, in the run directory.

Stateful algorithms (MOON's previous model, FedDyn's gradient, FedCCL's local signals, SCAFFOLD-style
variates) persist a small dict of numpy arrays per client. Workers are stateless: they read a client's
state before its update and write the new one after, so a worker can die or be replaced at any time and
10^4+ stateful clients cost disk, not memory.

Versions make resume exact: the state written in round ``r`` goes to ``<cid>/r<r>.npz``; a read for round
``r`` takes the newest version written *before* ``r``. After a crash, versions newer than the checkpoint
being resumed are simply never read (and are pruned), so the resumed run sees exactly what an
uninterrupted run saw. Old versions are pruned once a checkpoint no longer needs them.

Size and cost grow with the clients that took part, never with the population: a client that never trained
has no directory. A checkpoint prunes only the clients that trained since the previous one (their ids come from
the rounds' ledgers, :class:`~fedray.driver.callbacks.Checkpointer`): a client's older versions can only have
become unneeded by a write of its own. A resume scans every client directory once (versions written after the
checkpoint may belong to clients no ledger names).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from fedray.core.io import atomic_writer

_VERSION = re.compile(r"^r(\d+)\.npz$")


class ClientStateStore:
    def __init__(self, root: str | Path):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _dir(self, cid: int) -> Path:
        # two-level fan-out keeps directories small for 10^5 clients
        return self.root / f"{cid // 1000:04d}" / f"{cid:07d}"

    def versions(self, cid: int) -> list[int]:
        d = self._dir(cid)
        if not d.is_dir():
            return []
        out = []
        for name in os.listdir(d):
            m = _VERSION.match(name)
            if m:
                out.append(int(m.group(1)))
        return sorted(out)

    def load(self, cid: int, before_round: int) -> dict | None:
        """The newest state written in a round < ``before_round``; None if the client has none."""
        vs = [v for v in self.versions(cid) if v < before_round]
        if not vs:
            return None
        path = self._dir(cid) / f"r{vs[-1]}.npz"
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}

    def save(self, cid: int, rnd: int, state: dict) -> None:
        d = self._dir(cid)
        d.mkdir(parents=True, exist_ok=True)
        arrays = {k: np.asarray(v) for k, v in state.items()}
        with atomic_writer(d / f"r{rnd}.npz", suffix=".tmp.npz") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy's stubs type **kwds as allow_pickle

    def prune(self, keep_from_round: int, drop_after_round: int | None = None,
              clients: Iterable[int] | None = None) -> None:
        """Delete versions no read at round >= ``keep_from_round`` can need, and (on resume) versions
        written after ``drop_after_round``; of the ``clients`` given (their directories only), else of every
        client that has a directory."""
        if not self.root.is_dir():
            return
        if clients is not None:
            for cid in sorted(set(int(c) for c in clients)):
                d = self._dir(cid)
                if d.is_dir():
                    _prune_dir(str(d), keep_from_round, drop_after_round)
            return
        for fan in os.scandir(self.root):
            if not fan.is_dir():
                continue
            for cdir in os.scandir(fan.path):
                if cdir.is_dir():
                    _prune_dir(cdir.path, keep_from_round, drop_after_round)

    def empty(self) -> bool:
        """Whether no client has state here (a stateless algorithm's run)."""
        if not self.root.is_dir():
            return True
        with os.scandir(self.root) as it:
            return next(it, None) is None

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        self.root.mkdir(parents=True, exist_ok=True)


def _prune_dir(path: str, keep_from_round: int, drop_after_round: int | None) -> None:
    """:meth:`ClientStateStore.prune` for the one client directory ``path`` (temporary files of writes a killed
    worker left are deleted too)."""
    vs = []
    for name in os.listdir(path):
        m = _VERSION.match(name)
        if m:
            vs.append(int(m.group(1)))
        elif name.endswith(".tmp.npz"):
            os.unlink(os.path.join(path, name))
    vs.sort()
    if drop_after_round is not None:
        for v in [v for v in vs if v > drop_after_round]:
            os.unlink(os.path.join(path, f"r{v}.npz"))
        vs = [v for v in vs if v <= drop_after_round]
    older = [v for v in vs if v < keep_from_round]
    for v in older[:-1]:  # the newest older version is still the one a read would take
        os.unlink(os.path.join(path, f"r{v}.npz"))
