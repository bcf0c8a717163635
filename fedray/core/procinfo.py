"""Process memory and CPU time read from /proc (coordinator, workers, sweep drivers, `fedray up`'s idle workers)."""

from __future__ import annotations

import math
import os

__all__ = ["proc_cpu_seconds", "proc_memory_mb", "proc_status"]


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


def proc_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds process ``pid`` has used, from /proc/<pid>/stat; None when unreadable."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
