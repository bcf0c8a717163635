"""Driver callbacks: what happens around each round besides running it (after pfl's and Ray Train's).

The round loop (:class:`fedray.driver.rounds.RoundLoop`) calls, in list order, ``on_run_start`` once,
``on_round_start`` before each round, ``on_round_end`` after each recorded round (its ``metrics.jsonl`` row;
a ``True`` return asks the loop to stop after this round), ``on_restart`` when a new coordinator replaced a
dead one (the loop goes back to the last checkpoint) and ``on_run_end`` once, also after an interruption.
Each concern is one small object. Here, what reports a run: the progress display, TensorBoard, the
experiment trackers (MLflow, W&B) and a user's per-round hook (the Optuna pruner); the engine's own,
checkpoints and the driver fault injection of the tests, are in :mod:`fedray.driver.callbacks`.
"""

from __future__ import annotations

from pathlib import Path

from fedray.config import ConfigError
from fedray.reporting.progress import ProgressBar
from fedray.reporting.rundir import RunDir, TensorBoardLogger
from fedray.reporting.trackers import scalar_metrics

__all__ = ["Callback", "OnRound", "Progress", "TensorBoard", "Trackers"]


class Callback:
    def on_run_start(self, loop, start_round: int) -> None:
        """Before the first round of this process (``start_round`` > 1 after a resume)."""

    def on_round_start(self, loop, rnd: int) -> None:
        """Before round ``rnd`` is sent to the coordinator."""

    def on_round_end(self, loop, report: dict) -> bool | None:
        """After round ``report['round']`` was recorded; True asks the loop to stop after it."""

    def on_restart(self, loop, start_round: int) -> None:
        """A new coordinator replaced a dead one at the last checkpoint; the loop goes on at ``start_round``."""

    def on_run_end(self, loop, interrupted: bool) -> None:
        """Once, when the loop ends (finished, stopped early or interrupted)."""


class Progress(Callback):
    """A bar over the rounds on a terminal (:class:`fedray.reporting.progress.ProgressBar`), else one log
    line per round (when ``enabled``)."""

    def __init__(self, enabled: bool, rounds: int, log=print):
        self.enabled, self.rounds, self.log = enabled, int(rounds), log
        self.bar = None

    def on_run_start(self, loop, start_round):
        bar = ProgressBar(self.rounds, "round", initial=start_round - 1, enabled=self.enabled, log=self.log)
        self.bar = bar if bar.active else None

    def on_round_end(self, loop, report):
        if self.bar is not None:
            acc = report.get("accuracy")
            self.bar.update(1, acc="-" if acc is None else f"{acc:.3f}", s=f"{report['seconds_total']:.2f}")
        elif self.enabled:
            acc = report.get("accuracy")
            self.log(f"[fedray] round {report['round']:4d}/{self.rounds}  "
                     f"acc {acc if acc is None else f'{acc:.4f}'}  loss {report['loss']:.4f}  "
                     f"{report['seconds_total']:.2f} s")

    def on_restart(self, loop, start_round):
        if self.bar is not None:
            self.bar.reset(start_round - 1)

    def on_run_end(self, loop, interrupted):
        if self.bar is not None:
            self.bar.close()


class TensorBoard(Callback):
    """Scalars per round under ``<run dir>/tb`` (a missing tensorboard package is said once, not fatal)."""

    def __init__(self, log_dir, log=print):
        self.writer = None
        try:
            self.writer = TensorBoardLogger(log_dir)
        except Exception as e:  # noqa: BLE001 - tensorboard missing: say so once, keep running
            log(f"[fedray] TensorBoard disabled: {e}")

    def on_round_end(self, loop, report):
        if self.writer is not None:
            self.writer.log(report)

    def on_run_end(self, loop, interrupted):
        if self.writer is not None:
            self.writer.close()


class OnRound(Callback):
    """A user's ``on_round(report) -> bool | None`` (e.g. an Optuna pruner); True stops the run."""

    def __init__(self, fn):
        self.fn = fn

    def on_round_end(self, loop, report):
        return bool(self.fn(report))


class Trackers(Callback):
    """Mirrors the run into experiment trackers (:mod:`fedray.reporting.trackers`: MLflow, W&B).

    ``<run dir>/trackers.json`` keeps, per tracker, its run's id and the last round it holds; ``fedray run
    --resume`` (and a coordinator restart) continue that tracker run and send only rounds it does not hold
    yet: the rounds re-run after the checkpoint are bit-identical in every result (only timings differ), so
    each step is logged once. A tracker run that was lost (another store) is started anew and gets every
    recorded round. :meth:`start` (before the engine starts) raises a ConfigError when a tracker cannot
    start. A tracker that fails later is stopped with one warning giving the round and the reason, and the
    failure is kept in trackers.json (``fedray show`` prints it): the FL run goes on, metrics.jsonl keeps
    every round, and a ``--resume`` of an unfinished run sends the rounds the tracker missed."""

    FILE = "trackers.json"

    def __init__(self, rd: RunDir, trackers: list, log=print):
        self.rd, self.trackers, self.log = rd, list(trackers), log
        path = rd.path / self.FILE
        self.state: dict = rd.read_json(self.FILE) if self.trackers and path.is_file() else {}
        self.live: list = []

    def _save(self) -> None:
        self.rd.write_json(self.FILE, self.state)

    def start(self, cfg, run_info: dict) -> None:
        self.tags = {k: str(run_info[k]) for k in ("config_hash", "partition_hash", "algorithm", "model", "source")
                     if k in run_info}
        self.tags["run_dir"] = str(self.rd.path.resolve())
        config = cfg.to_dict()
        config.pop("source_path", None)
        for t in self.trackers:
            old = self.state.get(t.name, {})
            try:
                st = t.start(old, config, self.tags, self.log)
            except Exception as e:  # noqa: BLE001 - a wrong URI, an unreachable server, no login: before any work
                self.finish("failed", {})  # the ones already started
                if isinstance(e, ConfigError):
                    raise
                raise ConfigError(f"output.{t.name}: cannot start the {t.name} run: {type(e).__name__}: "
                                  f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}") from e
            last = 0 if st.pop("new") else int(old.get("last_round", 0))
            self.state[t.name] = {**st, "last_round": last, "error": None}
            self.live.append(t)
            self._save()

    def _send(self, row: dict) -> None:
        rnd, metrics, changed = int(row["round"]), None, False
        for t in list(self.live):
            st = self.state[t.name]
            if rnd <= st["last_round"]:
                continue
            metrics = metrics if metrics is not None else scalar_metrics(row)
            try:
                t.log(rnd, metrics)
            except Exception as e:  # noqa: BLE001 - the FL run goes on; the tracker stops, said once
                self.live.remove(t)
                st["error"] = f"round {rnd}: {type(e).__name__}: {str(e).strip()[:500]}"
                self.log(f"[fedray] {t.name}: could not log round {rnd} ({type(e).__name__}: {e}); it gets no "
                         f"more rounds in this run (it holds rounds 1-{st['last_round']}); the run goes on and "
                         f"metrics.jsonl keeps every round")
            else:
                st["last_round"] = rnd
            changed = True
        if changed:
            self._save()

    def on_run_start(self, loop, start_round):
        for row in loop.result.rounds:  # recorded before this process: what a tracker run does not hold yet
            self._send(row)

    def on_round_end(self, loop, report):
        self._send(report)

    def finish(self, status: str, final: dict) -> None:
        """After the run's own outputs: final metrics, run.json fields, files, and the end status."""
        files = [self.rd.path / n for n in ("config.yaml", "run.json", "summary.json")]
        for t in list(self.live):
            try:
                t.finish(status, final, files, {**self.tags, "status": status})
                self.state[t.name]["status"] = status
            except Exception as e:  # noqa: BLE001
                self.state[t.name]["error"] = f"finish: {type(e).__name__}: {str(e).strip()[:500]}"
                self.log(f"[fedray] {t.name}: could not close its run ({type(e).__name__}: {e})")
        for t in self.trackers:
            err = self.state.get(t.name, {}).get("error")
            if err:
                self.log(f"[fedray] {t.name}: incomplete, holds rounds 1-{self.state[t.name]['last_round']} "
                         f"({err}); every round is in {Path(self.rd.path) / 'metrics.jsonl'}")
        if self.trackers:
            self._save()
