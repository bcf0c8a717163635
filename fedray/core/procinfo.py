"""Process memory read from /proc by the process itself (coordinator, workers, sweep drivers)."""

from __future__ import annotations

import math

__all__ = ["proc_memory_mb", "proc_status"]


def proc_memory_mb(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS = VmHWM) of process ``pid`` in MB from /proc; NaNs when unreadable
    (another node, a finished process, no /proc)."""
    st = proc_status(pid)
    return st.get("VmRSS", math.nan), st.get("VmHWM", math.nan)


def proc_status(pid: int) -> dict[str, float]:
    """The ``Vm*`` / ``Rss*`` lines of /proc/<pid>/status in MB (empty when unreadable)."""
    out: dict[str, float] = {}
    try:
        with open(f"/proc/{int(pid)}/status") as f:
            for line in f:
                if line.startswith(("Vm", "Rss")) and line.rstrip().endswith("kB"):
                    key, val = line.split(":", 1)
                    out[key] = int(val.split()[0]) / 1024.0
    except (OSError, ValueError):
        pass
    return out
