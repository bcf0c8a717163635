"""Fault injection (``engine.fault_injection``), a testing aid, in one place.

``{kind: exit|raise, round: R, client: C, times: T[, iteration: I]}``: the first T times client C of round
R is started anywhere, its worker process exits (``exit``, like a crash or an OOM kill) or the client
raises (``raise``); ``iteration`` restricts it to one task of a split round (0 .. local_iters).
``{kind: hang, round: R, client: C}``: the first time client C of round R starts, its worker writes its Ray node
id (``-`` without Ray) to ``<run dir>/faults/hang-rR-cC`` and blocks there, so that a test can remove that node
while the client's task is in flight (a deterministic mid-round node loss); after ``HANG_S`` it raises instead,
so a test that never ends it cannot hang the run.
``{kind: stop, round: R, client: C}``: the first time client C of round R starts, its worker process stops
itself (SIGSTOP: hung, not dead; ``engine.heartbeat_s`` finds it).
``{kind: driver_exit, round: R}``: the driver process exits hard once, before round R.
``{kind: coordinator_exit, round: R}``: the coordinator process exits hard once, in the middle of round R
(when the scheduler takes the round's first finished task, i.e. after the round's tasks were dispatched);
``{kind: coordinator_stop, round: R}``: at the same moment it stops itself instead (SIGSTOP: hung, not dead).
Counter files under ``<run dir>/faults/`` (created with O_EXCL) make the count exact across worker
replacements, retries and concurrent workers.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from fedray.core.errors import TransientError
from fedray.core.io import atomic_write_text
from fedray.core.ray_env import current_node_id

__all__ = ["FaultInjector", "HANG_S"]

HANG_S = 300.0


class FaultInjector:
    def __init__(self, spec: dict | None, run_dir: str | Path):
        self.spec = dict(spec or {})
        self.dir = Path(run_dir) / "faults"

    def client(self, rnd: int, cid: int, iteration: int | None = None) -> None:
        """Called when a client's work starts (``iteration``: the split task number)."""
        f = self.spec
        if not f or int(f.get("round", -1)) != rnd or int(f.get("client", -1)) != cid:
            return
        if iteration is not None and "iteration" in f and int(f["iteration"]) != iteration:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        if f.get("kind") == "hang":
            self._hang(rnd, cid)
            return
        if f.get("kind") == "stop":
            if self._first(f"stop-r{rnd}-c{cid}"):
                os.kill(os.getpid(), signal.SIGSTOP)
            return
        times = int(f.get("times", 1))
        marker = self.dir / f"r{rnd}-c{cid}"
        for i in range(times):
            try:
                fd = os.open(f"{marker}.{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                continue
            os.close(fd)
            if f.get("kind", "exit") == "exit":
                os._exit(17)
            raise TransientError(f"injected fault in round {rnd}, client {cid}")

    def _hang(self, rnd: int, cid: int) -> None:
        name = self.dir / f"hang-r{rnd}-c{cid}"
        try:
            os.close(os.open(f"{name}.taken", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:  # hung once already: this is the client's re-run
            return
        atomic_write_text(name, current_node_id() or "-")
        deadline = time.monotonic() + HANG_S
        while time.monotonic() < deadline:
            time.sleep(0.1)
        raise TransientError(f"injected hang in round {rnd}, client {cid}: nobody ended it in {HANG_S:.0f} s")

    def driver(self, rnd: int) -> None:
        """Called by the driver before round ``rnd``: a hard crash of the driver, once."""
        self._exit_once("driver_exit", f"driver-r{rnd}", rnd)

    def coordinator(self, rnd: int) -> None:
        """Called by the coordinator's task scheduler for each finished task of round ``rnd``: a hard crash of
        the coordinator process, once (a restarted coordinator runs the round again without it), or its hang."""
        self._exit_once("coordinator_exit", f"coordinator-r{rnd}", rnd)
        f = self.spec
        if f.get("kind") == "coordinator_stop" and int(f.get("round", -1)) == rnd and self._first(f"stop-coordinator-r{rnd}"):
            os.kill(os.getpid(), signal.SIGSTOP)

    def _exit_once(self, kind: str, name: str, rnd: int) -> None:
        f = self.spec
        if f.get("kind") != kind or int(f.get("round", -1)) != rnd:
            return
        if self._first(name):
            os._exit(17)

    def _first(self, name: str) -> bool:
        """True the first time any process of the run asks for ``name`` (a marker file made with O_EXCL)."""
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.dir / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.close(fd)
        return True
