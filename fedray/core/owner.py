"""Who writes a record that says ``running``, and whether that process still lives.

A run's ``run.json``, a study's sessions in ``study.json`` and a sweep's in ``sweep.json`` say ``running`` while
their driver works, and the driver writes how it ended (``finished``, ``failed`` with the reason, ...). A driver
killed with SIGKILL, by the OOM killer or with its machine writes nothing, so each such record also names its
owner (:func:`owner_record`: pid, host, the process's start time and the machine's boot id; a pid alone can be
reused). A reader that finds ``running`` asks :func:`owner_state`; when the owner is dead the record is
``killed`` (:func:`settled_status`), with a reason saying so. On another host the owner's fate cannot be seen
from here: ``unknown``, and the record is left as it says.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from fedray.core.procinfo import proc_runs, proc_start_ticks

__all__ = ["crash_reason", "describe_device", "describe_owner", "device_kinds", "owner_record", "owner_state", "read_run_status", "settle_sessions", "settled_status"]


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def owner_record() -> dict:
    """This process as the owner of a record: ``{"pid", "host", "start_ticks", "boot_id", "started_at"}``."""
    pid = os.getpid()
    return {"pid": pid, "host": socket.gethostname(), "start_ticks": proc_start_ticks(pid), "boot_id": _boot_id(),
            "started_at": time.time()}


def owner_state(owner: dict | None) -> str:
    """``alive``, ``dead`` or ``unknown`` (no owner recorded, another host, or no /proc to look in)."""
    if not isinstance(owner, dict) or not isinstance(owner.get("pid"), int):
        return "unknown"
    if owner.get("host") != socket.gethostname():
        return "unknown"
    boot = _boot_id()
    if boot is not None and owner.get("boot_id") not in (None, boot):
        return "dead"  # the machine restarted since
    if owner.get("start_ticks") is None or proc_start_ticks(os.getpid()) is None:
        return "unknown"
    return "alive" if proc_runs(int(owner["pid"]), owner["start_ticks"]) else "dead"


def describe_owner(owner: dict | None) -> str:
    """``pid N on HOST`` (``an unrecorded process`` for a record without an owner)."""
    if not isinstance(owner, dict) or "pid" not in owner:
        return "an unrecorded process"
    return f"pid {owner['pid']} on {owner.get('host', '?')}"


def settled_status(status: str, owner: dict | None, what: str = "driver") -> tuple[str, str | None]:
    """``(status, reason)``: ``status`` as recorded, except ``running`` with a dead owner, which is ``killed``
    with the reason (None where there is nothing to add)."""
    if status == "running" and owner_state(owner) == "dead":
        return "killed", (f"its {what} ({describe_owner(owner)}) ended without recording how: killed (SIGKILL, the "
                          f"OOM killer) or its machine went down")
    return status, None


def read_run_status(run_dir: str | Path) -> tuple[dict, str, str | None]:
    """``(run.json, status, reason)`` of a run directory: the status as recorded, except a ``running`` run whose
    driver is dead, which is ``killed`` (:func:`settled_status`); the reason is then that, else the recorded error.
    ``({}, "unreadable run.json", None)`` when it cannot be read."""
    try:
        info = json.loads((Path(run_dir) / "run.json").read_text())
        status = str(info.get("status", "?"))
    except (OSError, ValueError, AttributeError):
        return {}, "unreadable run.json", None
    status, why = settled_status(status, info.get("owner"))
    return info, status, why or info.get("error")


def settle_sessions(sessions: list[dict], *, lock_held: bool) -> list[dict]:
    """Mark ``killed`` (with ``reason`` and ``found_at``) each session of a study's or a sweep's record that says
    ``running`` and whose driver is dead; with ``lock_held`` (this process holds the record's driver lock, which the
    OS releases when its holder dies) each one on this host too (its pid may run another process by now). Returns
    those marked."""
    here = socket.gethostname()
    marked = []
    for s in sessions:
        if s.get("status") != "running":
            continue
        if owner_state(s) == "dead" or (lock_held and s.get("host") == here):
            s.update(status="killed", found_at=time.time(),
                     reason=f"its driver ({describe_owner(s)}) ended without closing the session: killed (SIGKILL, "
                            f"the OOM killer) or its machine went down")
            marked.append(s)
    return marked


def crash_reason(err: BaseException) -> str:
    """Why a driver's session (a sweep's, a study's) ended by ``err``, for its record: the exception's first line;
    a ``KeyboardInterrupt`` that the session did not turn into an interruption came while it was already stopping."""
    if isinstance(err, KeyboardInterrupt):
        return "KeyboardInterrupt: a second Ctrl-C or SIGTERM while it stopped"
    text = str(err).strip().splitlines()
    return f"{type(err).__name__}: {text[0]}" if text else type(err).__name__


def device_kinds(device: dict) -> set[str]:
    """The kinds (``cpu``, ``cuda``) in ``run.json``'s ``device``: ``{"coordinator": NAME, "workers": [NAME, ...]}``,
    each NAME ``cpu`` or ``cuda (GPU model)`` (:func:`fedray.engine.replica.device_name`)."""
    return {name.split(" ")[0] for name in [device["coordinator"], *device["workers"]]}


def describe_device(device: dict) -> str:
    """``run.json``'s ``device`` in words: ``cpu``, or ``coordinator cpu, workers cuda (...)`` where they differ."""
    if [device["coordinator"]] == device["workers"]:
        return device["coordinator"]
    return f"coordinator {device['coordinator']}, workers {', '.join(device['workers'])}"
