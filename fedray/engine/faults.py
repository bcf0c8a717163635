"""Fault injection (``engine.fault_injection``), a testing aid, in one place.

``{kind: exit|raise, round: R, client: C, times: T[, iteration: I]}``: the first T times client C of round
R is started anywhere, its worker process exits (``exit``, like a crash or an OOM kill) or the client
raises (``raise``); ``iteration`` restricts it to one task of a split round (0 .. local_iters).
``{kind: driver_exit, round: R}``: the driver process exits hard once, before round R.
``{kind: coordinator_exit, round: R}``: the coordinator process exits hard once, in the middle of round R
(when the scheduler takes the round's first finished task, i.e. after the round's tasks were dispatched).
Counter files under ``<run dir>/faults/`` (created with O_EXCL) make the count exact across worker
replacements, retries and concurrent workers.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["FaultInjector"]


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
        times = int(f.get("times", 1))
        marker = self.dir / f"r{rnd}-c{cid}"
        self.dir.mkdir(parents=True, exist_ok=True)
        for i in range(times):
            try:
                fd = os.open(f"{marker}.{i}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                continue
            os.close(fd)
            if f.get("kind", "exit") == "exit":
                os._exit(17)
            raise RuntimeError(f"injected fault in round {rnd}, client {cid}")

    def driver(self, rnd: int) -> None:
        """Called by the driver before round ``rnd``: a hard crash of the driver, once."""
        self._exit_once("driver_exit", f"driver-r{rnd}", rnd)

    def coordinator(self, rnd: int) -> None:
        """Called by the coordinator's task scheduler for each finished task of round ``rnd``: a hard crash of
        the coordinator process, once (a restarted coordinator runs the round again without it)."""
        self._exit_once("coordinator_exit", f"coordinator-r{rnd}", rnd)

    def _exit_once(self, kind: str, name: str, rnd: int) -> None:
        f = self.spec
        if f.get("kind") != kind or int(f.get("round", -1)) != rnd:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.dir / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.close(fd)
        os._exit(17)
