"""Measurements taken while a run is in progress, for the scaling sweep (:mod:`fedray.apps.scale`):
object-store use of the connected Ray cluster and GPU utilisation / memory sampled from ``nvidia-smi``.
Both degrade to NaN where Ray or GPUs are absent; neither ever fails a sweep."""

from __future__ import annotations

import math
import shutil
import subprocess
import threading

import numpy as np


class ObjectStoreProbe:
    """Object-store use of the connected Ray cluster (bytes in use, bytes spilled), via the raylet's
    memory-info RPC that ``ray memory --stats-only`` uses. ``read()`` returns NaNs when Ray is not
    initialised or the (private) API is unavailable."""

    def __init__(self):
        self._state = None
        self._failed = False

    def read(self) -> tuple[float, float]:
        if self._failed:
            return math.nan, math.nan
        try:
            import ray

            if not ray.is_initialized():
                return math.nan, math.nan
            from ray._private.internal_api import get_memory_info_reply, get_state_from_address

            if self._state is None:
                self._state = get_state_from_address(ray.get_runtime_context().gcs_address)
            st = get_memory_info_reply(self._state, timeout_seconds=10.0).store_stats
            return st.object_store_bytes_used / 2**20, st.spilled_bytes_total / 2**20
        except Exception:  # noqa: BLE001 - a measurement aid: never fail the sweep for it
            self._failed = True
            return math.nan, math.nan


class GpuSampler(threading.Thread):
    """Samples ``nvidia-smi`` (utilisation %, memory used MB, summed over GPUs) every ``period`` s.
    Does nothing where ``nvidia-smi`` is missing or reports no GPU."""

    def __init__(self, period: float = 0.5):
        super().__init__(daemon=True)
        self.period = period
        self.util: list[float] = []
        self.mem: list[float] = []
        self._halt = threading.Event()
        self.available = shutil.which("nvidia-smi") is not None

    def _read(self) -> tuple[float, float] | None:
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=utilization.gpu,memory.used",
                                  "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=5)
        except (OSError, subprocess.SubprocessError):
            return None
        rows = [r.split(",") for r in out.stdout.strip().splitlines() if r.strip()]
        if out.returncode != 0 or not rows:
            return None
        try:
            return float(np.mean([float(r[0]) for r in rows])), float(sum(float(r[1]) for r in rows))
        except (ValueError, IndexError):
            return None

    def run(self) -> None:
        if not self.available:
            return
        while not self._halt.is_set():
            got = self._read()
            if got is None:
                return
            self.util.append(got[0])
            self.mem.append(got[1])
            self._halt.wait(self.period)

    def stop(self) -> dict:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=10)
        if not self.util:
            return {"gpu_util_mean_pct": math.nan, "gpu_util_max_pct": math.nan, "gpu_mem_max_mb": math.nan}
        return {"gpu_util_mean_pct": float(np.mean(self.util)), "gpu_util_max_pct": float(np.max(self.util)),
                "gpu_mem_max_mb": float(np.max(self.mem))}
