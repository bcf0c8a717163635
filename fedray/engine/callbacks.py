"""Driver callbacks: what happens around each round besides running it (after pfl's and Ray Train's).

The round loop (:class:`fedray.engine.runner.RoundLoop`) calls, in list order, ``on_run_start`` once,
``on_round_start`` before each round, ``on_round_end`` after each recorded round (a ``True`` return asks
the loop to stop after this round), ``on_restart`` when a new coordinator replaced a dead one (the loop
goes back to the last checkpoint) and ``on_run_end`` once, also after an interruption. Each concern is
one small object: the progress display, TensorBoard, checkpoints, a user's per-round hook (the Optuna
pruner), the driver fault injection of the tests.
"""

from __future__ import annotations

import os
import sys

from fedray.engine.faults import FaultInjector
from fedray.engine.state import ClientStateStore
from fedray.reporting.rundir import RunDir, TensorBoardLogger

__all__ = ["Callback", "Checkpointer", "DriverFaults", "OnRound", "Progress", "TensorBoard"]


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
    """A tqdm bar on a terminal, else one log line per round (when ``enabled``)."""

    def __init__(self, enabled: bool, rounds: int, log=print):
        self.enabled, self.rounds, self.log = enabled, int(rounds), log
        self.bar = None

    def on_run_start(self, loop, start_round):
        if self.enabled and sys.stderr.isatty() and not os.environ.get("TQDM_DISABLE"):
            from tqdm import tqdm

            self.bar = tqdm(total=self.rounds, initial=start_round - 1, unit="round", dynamic_ncols=True)

    def on_round_end(self, loop, report):
        if self.bar is not None:
            self.bar.set_postfix({"acc": f"{report.get('accuracy', float('nan')):.3f}",
                                  "s": f"{report['seconds_total']:.2f}"})
            self.bar.update(1)
        elif self.enabled:
            acc = report.get("accuracy")
            self.log(f"[fedray] round {report['round']:4d}/{self.rounds}  "
                     f"acc {acc if acc is None else f'{acc:.4f}'}  loss {report['loss']:.4f}  "
                     f"{report['seconds_total']:.2f} s")

    def on_restart(self, loop, start_round):
        if self.bar is not None:
            self.bar.reset(total=self.rounds)
            self.bar.update(start_round - 1)

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


class Checkpointer(Callback):
    """A checkpoint every ``every`` rounds, at the last round and when the loop stops early; on an
    interruption or a failure, one for the last recorded (good) round if it has none. Client-state versions no later round
    can read are pruned after each checkpoint."""

    def __init__(self, rundir: RunDir, every: int, keep: int, rounds: int, state_path, log=print):
        self.rd, self.every, self.keep, self.rounds = rundir, int(every), int(keep), int(rounds)
        self.state_path, self.log = state_path, log
        self.last = 0

    def on_run_start(self, loop, start_round):
        self.last = start_round - 1

    on_restart = on_run_start  # the loop goes back to the checkpoint of round start_round - 1

    def save(self, loop, rnd: int) -> None:
        self.rd.save_checkpoint(loop.engine.call("state_dict"), keep=self.keep)
        self.last = rnd
        ClientStateStore(self.state_path).prune(keep_from_round=rnd + 1)

    def on_round_end(self, loop, report):
        rnd = int(report["round"])
        if self.every and (rnd % self.every == 0 or rnd == self.rounds or loop.stopping):
            self.save(loop, rnd)

    def on_run_end(self, loop, interrupted):
        done = loop.result.rounds[-1]["round"] if loop.result.rounds else 0
        if (interrupted or loop.result.failed) and done > self.last:
            try:
                self.rd.save_checkpoint(loop.engine.call("state_dict"), keep=self.keep)
            except Exception as e:  # noqa: BLE001
                self.log(f"[fedray] could not write the final checkpoint: {e}")


class OnRound(Callback):
    """A user's ``on_round(report) -> bool | None`` (e.g. an Optuna pruner); True stops the run."""

    def __init__(self, fn):
        self.fn = fn

    def on_round_end(self, loop, report):
        return bool(self.fn(report))


class DriverFaults(Callback):
    """``engine.fault_injection: {kind: driver_exit, round: R}``: the driver dies hard before round R."""

    def __init__(self, injector: FaultInjector):
        self.injector = injector

    def on_round_start(self, loop, rnd):
        self.injector.driver(rnd)
