"""Process memory and CPU time read from /proc (coordinator, workers, sweep drivers, `fedray up`'s idle workers)."""

from __future__ import annotations

import math
import os

__all__ = ["proc_age_seconds", "proc_children", "proc_cpu_seconds", "proc_memory_mb", "proc_runs", "proc_start_ticks",
           "proc_status"]


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
    f = _stat_fields(pid)
    try:
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK") if f else None
    except (IndexError, ValueError):
        return None


def _stat_fields(pid: int) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat after the command name (field 3 onwards); None when unreadable."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, ValueError, IndexError):
        return None


def proc_start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot: with the pid, it names one process (a pid can
    be reused, this pair cannot); None when unreadable."""
    f = _stat_fields(pid)
    try:
        return int(f[19]) if f else None
    except (IndexError, ValueError):
        return None


def proc_age_seconds(pid: int | None = None) -> float | None:
    """Seconds since process ``pid`` (default: this one) started, from its start time in /proc/<pid>/stat and
    the machine's uptime (both to a clock tick, 10 ms); None when unreadable (no /proc)."""
    start = proc_start_ticks(os.getpid() if pid is None else pid)
    try:
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return None if start is None else max(0.0, uptime - start / os.sysconf("SC_CLK_TCK"))


def proc_runs(pid: int, start_ticks: int | None) -> bool:
    """Process ``pid`` that started at ``start_ticks`` (:func:`proc_start_ticks`) still runs: it exists, is that
    same process, and is not a zombie (an exited child nobody reaped)."""
    f = _stat_fields(pid)
    if not f or start_ticks is None:
        return False
    try:
        return f[0] != b"Z" and int(f[19]) == start_ticks
    except (IndexError, ValueError):
        return False


def proc_children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` now (empty when there is none, or no /proc)."""
    out: list[int] = []
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for d in names:
        if d.isdigit():
            f = _stat_fields(int(d))
            if f and len(f) > 1 and f[1] == str(int(pid)).encode():
                out.append(int(d))
    return sorted(out)
