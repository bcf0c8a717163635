"""The engine's driver callbacks (:class:`fedray.reporting.callbacks.Callback`): checkpoints every
``output.checkpoint_every`` rounds and the driver fault injection of the tests. The callbacks that report a
run (progress, TensorBoard, trackers, ``on_round``) are in :mod:`fedray.reporting.callbacks`.
"""

from __future__ import annotations

from fedray.engine.faults import FaultInjector
from fedray.driver.rounds import _signals_deferred
from fedray.engine.state import ClientStateStore
from fedray.reporting.callbacks import Callback
from fedray.reporting.rundir import RunDir

__all__ = ["Checkpointer", "DriverFaults"]


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
        self.rd.save_checkpoint(loop.engine.state_dict(), keep=self.keep)
        states = ClientStateStore(self.state_path)
        if not states.empty():  # the clients that trained since the last checkpoint: theirs are the only new versions
            states.prune(keep_from_round=rnd + 1, clients=self._trained(self.last + 1, rnd))
        self.last = rnd

    def _trained(self, first: int, last: int) -> list[int] | None:
        """The clients in the ledgers of rounds ``first .. last``; None (prune every client) when one is missing."""
        import pyarrow.parquet as pq

        out: list[int] = []
        for r in range(first, last + 1):
            path = self.rd.path / "ledger" / f"round-{r:06d}.parquet"
            if not path.is_file():
                return None
            out += pq.read_table(path, columns=["client"]).column(0).to_pylist()
        return out

    def on_round_end(self, loop, report):
        rnd = int(report["round"])
        if self.every and (rnd % self.every == 0 or rnd == self.rounds or loop.stopping):
            self.save(loop, rnd)

    def on_run_end(self, loop, interrupted):
        done = loop.result.rounds[-1]["round"] if loop.result.rounds else 0
        if (interrupted or loop.result.failed) and done > self.last:
            with _signals_deferred():  # a second Ctrl-C / SIGTERM now waits for this checkpoint (found by chaos)
                self._final(loop, done)

    def _final(self, loop, done: int) -> None:
        """The checkpoint of the last recorded round ``done``, at the end of an interrupted or failed run."""
        try:
            state = loop.engine.state_dict()
            if int(state["round"]) != done:  # a round ran but its row was not written (a full disk): a
                # checkpoint of it would skip that round on --resume; the last checkpoint stays the one
                self.log(f"[fedray] no final checkpoint: the coordinator is at round {state['round']}, the "
                         f"last recorded round is {done}")
                return
            self.rd.save_checkpoint(state, keep=self.keep)
        except Exception as e:  # noqa: BLE001
            self.log(f"[fedray] could not write the final checkpoint: {e}")


class DriverFaults(Callback):
    """``engine.fault_injection: {kind: driver_exit, round: R}``: the driver dies hard before round R."""

    def __init__(self, injector: FaultInjector):
        self.injector = injector

    def on_round_start(self, loop, rnd):
        self.injector.driver(rnd)
