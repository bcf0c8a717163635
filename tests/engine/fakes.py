"""A fake pool for the engine's unit tests: tasks run at submit time, come back in a seeded shuffled order."""

from __future__ import annotations

import numpy as np

from fedray.engine.outcomes import WorkerLost
from fedray.engine.pool import PoolBase


class Handle:
    def __init__(self, value, widx: int):
        self.value, self.widx = value, widx


class ShuffledPool(PoolBase):
    """``run(widx, method, *args)`` (the test's) computes a task's result at submit time, or returns None for a
    task whose worker is lost; ``wait`` hands back a seeded random non-empty subset of the tasks in flight, in a
    shuffled order; a lost worker is replaced in place, as the in-process pool does."""

    kind = "local"

    def __init__(self, size: int, order_seed: int):
        self.size, self.restarts = size, 0
        self.rng = np.random.default_rng(order_seed)

    def run(self, widx: int, method: str, *args):
        raise NotImplementedError

    def put(self, obj):
        return obj

    def submit(self, widx, method, *args):
        return Handle(self.run(widx, method, *args), widx)

    def wait(self, handles, timeout=None):
        handles = list(handles)
        return [handles[int(i)] for i in self.rng.permutation(len(handles))[: self.rng.integers(1, len(handles) + 1)]]

    def result(self, h):
        if h.value is None:
            raise WorkerLost(f"w{h.widx} killed")
        return h.value

    def replace(self, widx):
        self.restarts += 1
        return True

    def cancel(self, handles):
        pass
