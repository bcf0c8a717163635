"""fedray.engine.programs.federated: the federated round program (fake pool)."""

from __future__ import annotations

import numpy as np



def test_drop_after_worker_losses_folds_the_results_buffered_behind_it():
    """A client whose task keeps losing its worker is dropped after its retries; results of later
    positions that finished meanwhile wait in the reorder buffer behind it and must still be folded, even
    when the drop is the round's last event (a fake pool returns the doomed task last, every time)."""
    import types

    from fedray.engine.outcomes import ClientOutcome, WorkerLost
    from fedray.engine.pool import PoolBase
    from fedray.engine.programs.federated import FederatedProgram

    bad = 3

    class Pool(PoolBase):
        size, restarts, kind = 2, 0, "local"

        def __init__(self):
            self.n = 0

        def submit(self, widx, method, rnd, w, p, items, hints):
            self.n += 1
            return (self.n, widx, tuple(items))

        def wait(self, handles, timeout=None):
            good = [h for h in handles if all(c != bad for _, c in h[2])]
            return good[:1] if good else handles[:1]

        def result(self, h):
            if any(c == bad for _, c in h[2]):
                raise WorkerLost("killed")
            return [ClientOutcome(cid=c, pos=p, weights=np.full(2, float(c), np.float32), num_samples=1, loss=0.0,
                                  seconds=0.0, worker="w") for p, c in h[2]]

        def replace(self, widx):
            self.restarts += 1
            return True

        def cancel(self, handles):
            pass

    eng = types.SimpleNamespace(over_selection=0, round_deadline_s=None, reorder_window=None, max_client_retries=1,
                                max_dropped_fraction=1.0,
                                max_worker_restarts=10, chunk_size=1, multi_client=1)
    cfg = types.SimpleNamespace(engine=eng, train=types.SimpleNamespace(clients_per_round=6))
    prog = FederatedProgram(cfg=cfg, algorithm=types.SimpleNamespace(client_weight=lambda n: float(n)),
                            server_opt=None, pool=Pool(), sizes=np.ones(10, np.int64), num_params=2)
    out = prog.train(1, [0, 1, 2, 3, 4, 5], None, None, None)
    assert out.dropped == [bad] and out.tally.clients == 5 and out.worker_restarts == 2
    np.testing.assert_allclose(out.avg, np.full(2, np.mean([0, 1, 2, 4, 5])), rtol=1e-6)


def _engine(**over):
    import types

    eng = dict(over_selection=0, round_deadline_s=None, reorder_window=None, max_client_retries=1,
               max_dropped_fraction=1.0, max_worker_restarts=10, chunk_size=None, multi_client=1)
    eng.update(over)
    return types.SimpleNamespace(**eng)


def test_straggler_mode_cuts_the_round_into_small_tasks_by_default():
    """A task's clients count as finished only when the whole task has: with the usual 4 tasks per worker, 10,000
    clients per round on 2 workers made tasks of 1,250 clients (a deadline dropped whole tasks of finished clients,
    over-selection trained every sampled client). Straggler mode takes 32 per worker; an explicit
    engine.chunk_size and multi-client groups are kept."""
    import types

    from fedray.engine.programs.federated import FederatedProgram

    def prog(**over):
        cfg = types.SimpleNamespace(engine=_engine(**over), train=types.SimpleNamespace(clients_per_round=10_000))
        return FederatedProgram(cfg=cfg, algorithm=None, server_opt=None, pool=types.SimpleNamespace(size=2),
                                sizes=np.ones(10, np.int64), num_params=4_522)

    assert prog().chunk_size(10_000) == 1_250
    assert prog().chunk_size(10_000, stragglers=True) == 157
    assert prog(chunk_size=1_000).chunk_size(10_000, stragglers=True) == 1_000
    assert prog(multi_client=16).chunk_size(10_000, stragglers=True) == 144
    assert prog().chunk_size(6, stragglers=True) == prog().chunk_size(6) == 1


def test_short_tasks_grow_towards_min_task_seconds_from_the_last_rounds_clients():
    """Tiny clients (100 a round of 0.4 ms on 2 workers): 8 tasks of 13 clients cost more in Ray's per-task cost than
    in training, so once a round has measured its clients the default chunk grows to about _MIN_TASK_SECONDS, at
    most one task per worker and within the held-updates cap; long clients, straggler mode and an explicit
    engine.chunk_size keep their chunks."""
    import types

    from fedray.engine.programs import federated
    from fedray.engine.programs.federated import FederatedProgram

    def prog(spc, num_params=1_226, **over):
        cfg = types.SimpleNamespace(engine=_engine(**over), train=types.SimpleNamespace(clients_per_round=100))
        p = FederatedProgram(cfg=cfg, algorithm=None, server_opt=None, pool=types.SimpleNamespace(size=2),
                             sizes=np.ones(10, np.int64), num_params=num_params)
        p.client_seconds = spc
        return p

    assert prog(None).chunk_size(100) == 13  # round 1: nothing measured yet
    assert prog(0.0004).chunk_size(100) == 50  # one task per worker
    assert prog(0.0004).chunk_size(1_000) == 125  # 125 x 0.4 ms = 50 ms already
    assert prog(0.0001).chunk_size(1_000) == 500
    assert prog(0.002).chunk_size(100) == 25  # 25 x 2 ms = 50 ms
    assert prog(0.01).chunk_size(100) == 13  # long enough as they are
    assert prog(0.0004).chunk_size(100, stragglers=True) == 2
    assert prog(0.0004, chunk_size=5).chunk_size(100) == 5
    cap = federated._HELD_UPDATES_BYTES // (4 * 10_000_000) // 6  # 10 M parameters: 6 updates held per worker
    assert prog(0.0004, num_params=10_000_000).chunk_size(100) == cap == 1


def test_the_next_rounds_chunks_follow_this_rounds_client_seconds():
    """train() records the mean seconds of the clients that finished (the ledger) and the next round's default
    chunks follow them: 100 clients of 0.4 ms on 2 workers go out as 8 tasks in round 1 and as 2 in round 2, with
    the same fold."""
    import types

    from fedray.engine.outcomes import ClientOutcome
    from fedray.engine.pool import PoolBase
    from fedray.engine.programs.federated import FederatedProgram

    class Pool(PoolBase):
        size, restarts, kind = 2, 0, "local"

        def __init__(self):
            self.tasks: list[int] = []

        def submit(self, widx, method, rnd, w, p, items, hints):
            self.tasks.append(len(items))
            return tuple(items)

        def wait(self, handles, timeout=None):
            return handles[:1]

        def result(self, h):
            return [ClientOutcome(cid=c, pos=p, weights=np.full(2, float(c), np.float32), num_samples=1, loss=0.0,
                                  seconds=0.0004, worker="w") for p, c in h]

        def replace(self, widx):
            return True

        def cancel(self, handles):
            pass

    cfg = types.SimpleNamespace(engine=_engine(), train=types.SimpleNamespace(clients_per_round=100))
    pool = Pool()
    prog = FederatedProgram(cfg=cfg, algorithm=types.SimpleNamespace(client_weight=lambda n: float(n)),
                            server_opt=None, pool=pool, sizes=np.ones(100, np.int64), num_params=2)
    first = prog.train(1, list(range(100)), None, None, None)
    assert pool.tasks == [13] * 7 + [9] and abs(prog.client_seconds - 0.0004) < 1e-12
    pool.tasks.clear()
    second = prog.train(2, list(range(100)), None, None, None)
    assert pool.tasks == [50, 50]
    assert first.avg.tobytes() == second.avg.tobytes()


def test_over_selection_stops_training_once_enough_clients_finished():
    """330 sampled for 300 (over_selection 0.1), results in submission order: the round stops after 300 clients,
    and the clients sampled last are never run (with tasks of 42 clients every sampled client trained)."""
    import types

    from fedray.engine.outcomes import ClientOutcome
    from fedray.engine.pool import PoolBase
    from fedray.engine.programs.federated import FederatedProgram

    class Pool(PoolBase):
        size, restarts, kind = 2, 0, "local"

        def __init__(self):
            self.n, self.ran = 0, 0

        def submit(self, widx, method, rnd, w, p, items, hints):
            self.n += 1
            self.ran += len(items)
            return (self.n, widx, tuple(items))

        def wait(self, handles, timeout=None):
            return handles[:1]

        def result(self, h):
            return [ClientOutcome(cid=c, pos=p, weights=np.full(2, 1.0, np.float32), num_samples=1, loss=0.0,
                                  seconds=0.0, worker="w") for p, c in h[2]]

        def cancel(self, handles):
            pass

    pool = Pool()
    cfg = types.SimpleNamespace(engine=_engine(over_selection=0.1), train=types.SimpleNamespace(clients_per_round=300))
    prog = FederatedProgram(cfg=cfg, algorithm=types.SimpleNamespace(client_weight=lambda n: float(n)),
                            server_opt=None, pool=pool, sizes=np.ones(400, np.int64), num_params=2)
    out = prog.train(1, list(range(330)), None, None, None)
    assert out.tally.clients == 300
    assert pool.ran < 330 and out.cancelled == 330 - 300
    np.testing.assert_allclose(out.avg, np.ones(2), rtol=1e-6)
