"""Fault injection (``engine.fault_injection``), a testing aid, in one place.

``{kind: exit|raise, round: R, client: C, times: T[, iteration: I]}``: the first T times client C of round
R is started anywhere, its worker process exits (``exit``, like a crash or an OOM kill) or the client
raises (``raise``); ``iteration`` restricts it to one task of a split round (0 .. local_iters).
``{kind: driver_exit, round: R}``: the driver process exits hard once, before round R.
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
        f = self.spec
        if f.get("kind") != "driver_exit" or int(f.get("round", -1)) != rnd:
            return
        marker = self.dir / f"driver-r{rnd}"
        if not marker.exists():
            self.dir.mkdir(parents=True, exist_ok=True)
            marker.write_text("1")
            os._exit(17)
