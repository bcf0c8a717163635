"""The run directory and everything written into it.

Layout of ``<output.root>/<name>/``::

    config.yaml            resolved config (what --resume reads back)
    run.json               config hash, partition hash, source fingerprint, versions, status
    metrics.jsonl          one JSON object per round, appended (the driver is the only writer)
    ledger/round-000001.parquet   per-client rows of each round (client, round, samples, loss, seconds,
                           worker, failure, attempt), one file per round, written atomically
    checkpoints/ckpt-000010.npz   arrays + a JSON tree, no pickle (fedray.core.checkpoint); atomic;
                           ``checkpoints/latest`` names the newest, and is what --resume trusts
    client_state/          per-client state of stateful algorithms (fedray.engine.state)
    tb/                    TensorBoard event files
    trackers.json          the MLflow / W&B runs this run mirrors into, and the last round each holds
    mlflow/                the default MLflow store (mlflow.db, artifacts/), when output.mlflow is on
    wandb/                 W&B's run folders (offline-run-*), when output.wandb is on
    summary.json           final metrics and the weights hash (written at the end)
    final_weights.npy      final global weights (flat float32)
    .space-reserve         256 KiB held while the run writes here, freed to record a failure on a full disk

Every file is written either append-only (metrics.jsonl, a failed append cut back) or by write-to-temp-then-rename,
so a crash or a full disk at any moment leaves the previous version intact.
"""

from __future__ import annotations

import errno
import json
import math
import os
import shutil
import time
from pathlib import Path

import numpy as np

from fedray.core.checkpoint import CheckpointError, read_checkpoint, write_checkpoint
from fedray.core.errors import DiskFull
from fedray.core.io import append_bytes, atomic_write_text, atomic_writer, is_temp_name

#: Bytes a run directory keeps in reserve (:meth:`RunDir.reserve_space`) so that a run stopped by a full disk can
#: still record why in run.json.
RESERVE_BYTES = 256 * 1024


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, float)):
        x = float(x)
        return None if math.isnan(x) or math.isinf(x) else x
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, np.ndarray):
        return _jsonable(x.tolist())
    return x


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    # --------------------------------------------------------------------------- basics
    def create(self) -> "RunDir":
        self.path.mkdir(parents=True, exist_ok=True)
        (self.path / "ledger").mkdir(exist_ok=True)
        (self.path / "checkpoints").mkdir(exist_ok=True)
        return self

    @property
    def metrics_path(self) -> Path:
        return self.path / "metrics.jsonl"

    @property
    def state_path(self) -> Path:
        return self.path / "client_state"

    def write_json(self, name: str, obj) -> None:
        atomic_write_text(self.path / name, json.dumps(_jsonable(obj), indent=2, sort_keys=True) + "\n")

    def read_json(self, name: str) -> dict:
        return json.loads((self.path / name).read_text())

    # --------------------------------------------------------------------------- metrics
    def append_metrics(self, row: dict) -> None:
        """One row, appended whole or not at all (:func:`fedray.core.io.append_bytes`)."""
        append_bytes(self.metrics_path, (json.dumps(_jsonable(row), sort_keys=True) + "\n").encode())

    def read_metrics(self) -> list[dict]:
        if not self.metrics_path.exists():
            return []
        rows = []
        for line in self.metrics_path.read_text().splitlines():
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a torn last line from a crash: everything before it is intact
        return rows

    def truncate_metrics(self, last_round: int) -> None:
        """On resume or a coordinator restart: keep the rows of rounds <= last_round (rewritten atomically)
        and delete the ledger files of later rounds."""
        rows = [r for r in self.read_metrics() if int(r.get("round", 0)) <= last_round]
        atomic_write_text(self.metrics_path, "".join(json.dumps(_jsonable(r), sort_keys=True) + "\n" for r in rows))
        for f in (self.path / "ledger").glob("round-*.parquet"):
            if int(f.stem.rsplit("-", 1)[1]) > last_round:
                f.unlink(missing_ok=True)

    def drop_unrecorded(self) -> None:
        """Delete the ledger files of rounds after the last row of ``metrics.jsonl``: a round whose row could not be
        written (a full disk) is not recorded, and ``--resume`` runs it again."""
        rows = self.read_metrics()
        last = int(rows[-1]["round"]) if rows else 0
        for f in (self.path / "ledger").glob("round-*.parquet"):
            if int(f.stem.rsplit("-", 1)[1]) > last:
                f.unlink(missing_ok=True)

    def write_ledger(self, rnd: int, rows: list[dict]) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        schema = pa.schema([
            ("client", pa.int64()), ("round", pa.int64()), ("samples", pa.int64()), ("loss", pa.float64()),
            ("seconds", pa.float64()), ("worker", pa.string()), ("failure", pa.string()), ("attempt", pa.int64()),
        ])
        table = pa.Table.from_pylist(rows, schema=schema)
        path = self.path / "ledger" / f"round-{rnd:06d}.parquet"
        with atomic_writer(path) as f:
            pq.write_table(table, f)

    def read_ledger(self):
        import pyarrow.parquet as pq
        import pyarrow as pa

        files = sorted((self.path / "ledger").glob("round-*.parquet"))
        if not files:
            return None
        return pa.concat_tables([pq.read_table(f) for f in files])

    # --------------------------------------------------------------------------- checkpoints
    def checkpoint_path(self, rnd: int) -> Path:
        return self.path / "checkpoints" / f"ckpt-{rnd:06d}.npz"

    def save_checkpoint(self, state: dict, keep: int = 2) -> Path:
        """Write round ``state['round']``'s checkpoint, point ``latest`` at it, then remove all but the
        ``keep`` newest checkpoints of rounds up to this one (and any of later rounds: a stale future)."""
        rnd = int(state["round"])
        path = self.checkpoint_path(rnd)
        with atomic_writer(path, suffix=".tmp.npz") as f:
            write_checkpoint(f, state)
        atomic_write_text(self.path / "checkpoints" / "latest", path.name + "\n")
        ckpts = sorted(p for p in (self.path / "checkpoints").glob("ckpt-*.npz") if self.checkpoint_round(p) <= rnd)
        stale = [p for p in (self.path / "checkpoints").glob("ckpt-*.npz") if self.checkpoint_round(p) > rnd]
        for old in ckpts[:-keep] + stale:
            old.unlink(missing_ok=True)
        return path

    def latest_checkpoint(self) -> Path | None:
        """The checkpoint ``checkpoints/latest`` names (None before the first checkpoint or when it is gone)."""
        latest = self.path / "checkpoints" / "latest"
        if not latest.is_file():
            return None
        path = self.path / "checkpoints" / latest.read_text().strip()
        return path if path.is_file() else None

    @staticmethod
    def checkpoint_round(path: Path) -> int:
        """The round of a checkpoint file named by :meth:`checkpoint_path` (``ckpt-000010.npz`` -> 10)."""
        return int(Path(path).stem.rsplit("-", 1)[1])

    def load_checkpoint(self) -> dict | None:
        """The checkpoint ``checkpoints/latest`` names; None when there is none yet. A ``latest`` that names
        a missing or unreadable file raises :class:`CheckpointError` (never a silent fall-back to an older
        or a stray file)."""
        latest = self.path / "checkpoints" / "latest"
        if not latest.is_file():
            return None
        name = latest.read_text().strip()
        path = self.path / "checkpoints" / name
        if not name or "/" in name or not path.is_file():
            raise CheckpointError(f"{latest}: names {name!r}, which is not a checkpoint file in {path.parent}")
        state = read_checkpoint(path)
        if not isinstance(state, dict) or "round" not in state or "weights" not in state:
            raise CheckpointError(f"{path}: not a fedray checkpoint (no round / weights)")
        return state

    # --------------------------------------------------------------------------- lifecycle
    def holds_run(self) -> bool:
        """Whether a run was started here (its ``run.json`` exists)."""
        return (self.path / "run.json").is_file()

    def clear(self) -> None:
        """Delete every file a run writes here (``--overwrite``): a new run starts from nothing."""
        for name in ("checkpoints", "ledger", "client_state", "tb", "faults", "mlflow", "wandb"):
            shutil.rmtree(self.path / name, ignore_errors=True)
        for name in ("metrics.jsonl", "summary.json", "final_weights.npy", "run.json", "config.yaml", "trackers.json",
                     self.RESERVE):
            (self.path / name).unlink(missing_ok=True)

    def remove_temp_files(self) -> list[Path]:
        """Delete the temporary files of writes that a killed process left half-done (:func:`fedray.core.io.is_temp_name`;
        never read, since a write becomes visible only by its rename); only while no process writes here. Returns them."""
        dirs = [self.path, self.path / "checkpoints", self.path / "ledger"]
        files = [p for d in dirs if d.is_dir() for p in d.iterdir()]
        files += list(self.state_path.rglob(".*")) if self.state_path.is_dir() else []
        stale = [p for p in files if p.is_file() and is_temp_name(p.name)]
        for p in stale:
            p.unlink(missing_ok=True)
        return stale

    # --------------------------------------------------------------------------- disk space
    RESERVE = ".space-reserve"

    def reserve_space(self) -> None:
        """Hold :data:`RESERVE_BYTES` of disk in ``.space-reserve`` while the run writes here: when the disk fills up,
        :meth:`release_space` frees it so that run.json can still say why the run failed."""
        path = self.path / self.RESERVE
        if path.is_file() and path.stat().st_size >= RESERVE_BYTES:
            return
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, RESERVE_BYTES)
        except OSError as e:
            path.unlink(missing_ok=True)
            if e.errno in (errno.ENOSPC, errno.EDQUOT):
                raise DiskFull(e.errno, f"no space left on device for the run directory {self.path} (a run keeps "
                                        f"{RESERVE_BYTES // 1024} KiB there to record how it ends)") from e
            raise
        finally:
            os.close(fd)

    def release_space(self) -> None:
        (self.path / self.RESERVE).unlink(missing_ok=True)


class TensorBoardLogger:
    """Scalars per round as TensorBoard event files, written with the ``tensorboard`` package's own event-file
    writer (the one ``torch.utils.tensorboard`` wraps), so that a Ray run's driver never imports torch."""

    def __init__(self, log_dir: Path):
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = Event, Summary
        self.writer = EventFileWriter(str(log_dir), flush_secs=10)

    def log(self, row: dict) -> None:
        """Every number of the row (:func:`fedray.reporting.trackers.scalar_metrics`, as for MLflow and W&B), one
        event per round."""
        from fedray.reporting.trackers import scalar_metrics

        values = [self._summary.Value(tag=key, simple_value=float(v)) for key, v in scalar_metrics(row).items()]
        self.writer.add_event(self._event(wall_time=time.time(), step=int(row["round"]),
                                          summary=self._summary(value=values)))

    def close(self) -> None:
        self.writer.close()


def last_accuracy(rows) -> float:
    """Test accuracy at the last evaluated round of metrics rows (NaN when no round was evaluated)."""
    for r in reversed(rows):
        if r.get("accuracy") is not None:
            return float(r["accuracy"])
    return math.nan
