"""fedray/core/warm_workers.py without Ray: the code fingerprint that decides which idle workers a warm run may
use, the runtime env a warm job carries, and how idle workers are told apart from a job's own processes (real
child processes standing in for the raylet's). With a real `fedray up` cluster: tests/core/test_ray_up.py."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from fedray.core import warm_workers


def _package(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    (pkg / "notes.txt").write_text("not code\n")
    return pkg


def test_fingerprint_follows_the_source_files(tmp_path):
    """Same files: same fingerprint. An edit, a touch (mtime), a new or a removed module: another one.
    Files that are not Python do not count."""
    pkg = _package(tmp_path)
    first = warm_workers.code_fingerprint(pkg)
    assert first == warm_workers.code_fingerprint(pkg) and len(first) == 16
    (pkg / "notes.txt").write_text("edited\n")
    assert warm_workers.code_fingerprint(pkg) == first
    seen = {first}
    st = (pkg / "a.py").stat()
    os.utime(pkg / "a.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))  # touched, same content
    seen.add(warm_workers.code_fingerprint(pkg))
    (pkg / "sub" / "b.py").write_text("y = 3\n")
    seen.add(warm_workers.code_fingerprint(pkg))
    (pkg / "sub" / "c.py").write_text("")
    seen.add(warm_workers.code_fingerprint(pkg))
    (pkg / "sub" / "c.py").unlink()
    (pkg / "sub" / "b.py").rename(pkg / "sub" / "d.py")
    seen.add(warm_workers.code_fingerprint(pkg))
    assert len(seen) == 5


def test_runtime_env_keeps_the_jobs_own_settings():
    """The warm variable is added to a job's own env vars, and eager install is off (else the raylet starts a
    worker per CPU for each joining job, which the run never uses)."""
    env = warm_workers.runtime_env("abc", {"env_vars": {"A": "1"}, "pip": ["x"]})
    assert env == {"env_vars": {"A": "1", warm_workers.WARM_CODE_ENV: "abc"}, "pip": ["x"],
                   "config": {"eager_install": False}}
    assert warm_workers.runtime_env("abc")["env_vars"] == {warm_workers.WARM_CODE_ENV: "abc"}


def test_idle_workers_are_the_job_less_ones(tmp_path):
    """Children of the raylet (here: this test process) count as idle workers only when no job owns them
    (RAY_JOB_ID nil): ready ones are titled ray::IDLE, starting ones still run default_worker.py; a job's own
    worker and any other child are left out."""
    base = {k: v for k, v in os.environ.items() if k not in ("RAY_JOB_ID", warm_workers.WARM_CODE_ENV)}
    nil = {"RAY_JOB_ID": "ffffffff"}
    sleeper = [sys.executable, "-c", "import sys; sys.stdin.read()"]
    kids = {
        "ready": subprocess.Popen(["bash", "-c", f"exec -a ray::IDLE {sys.executable} -c 'import sys; sys.stdin.read()'"],
                                  stdin=subprocess.PIPE, env={**base, **nil, warm_workers.WARM_CODE_ENV: "c1"}),
        "ready_plain": subprocess.Popen(["bash", "-c", f"exec -a ray::IDLE {sys.executable} -c 'import sys; sys.stdin.read()'"],
                                        stdin=subprocess.PIPE, env={**base, **nil}),
        "starting": subprocess.Popen([*sleeper, "default_worker.py"], stdin=subprocess.PIPE,
                                     env={**base, **nil, warm_workers.WARM_CODE_ENV: "c2"}),
        "job_owned": subprocess.Popen(["bash", "-c", f"exec -a ray::IDLE {sys.executable} -c 'import sys; sys.stdin.read()'"],
                                      stdin=subprocess.PIPE, env={**base, "RAY_JOB_ID": "02000000",
                                                                  warm_workers.WARM_CODE_ENV: "c1"}),
        "other": subprocess.Popen(sleeper, stdin=subprocess.PIPE, env={**base, **nil}),
    }
    try:
        # exec -a has replaced bash once the command line reads ray::IDLE
        deadline = time.monotonic() + 30
        for k in ("ready", "ready_plain", "job_owned"):
            while not open(f"/proc/{kids[k].pid}/cmdline", "rb").read().startswith(b"ray::IDLE"):
                assert time.monotonic() < deadline, k
        ready, starting = warm_workers.idle_workers(os.getpid())
        assert ready == {kids["ready"].pid: "c1", kids["ready_plain"].pid: None}
        assert starting == {kids["starting"].pid: "c2"}
    finally:
        for p in kids.values():
            p.stdin.close()
            p.wait(timeout=30)


def test_no_refill_without_idle_workers(tmp_path):
    """A record that asks for no idle workers (or an older record without the raylet's port) starts nothing."""
    assert warm_workers.spawn_refill({"idle_workers": 0, "node_manager_port": 1, "temp_dir": str(tmp_path)}) is None
    assert warm_workers.spawn_refill({"idle_workers": 3, "temp_dir": str(tmp_path)}) is None


def test_wait_ready_waits_for_the_preload_to_finish(tmp_path, monkeypatch):
    """The raylet titles a worker ray::IDLE before its preload ends: wait_ready returns only once the idle
    worker's CPU time stops growing (here: a stand-in that computes for 1 CPU-second, then waits)."""
    from fedray.core.procinfo import proc_cpu_seconds

    monkeypatch.setattr(warm_workers, "_raylet_pid", lambda temp_dir: os.getpid())
    base = {k: v for k, v in os.environ.items() if k not in ("RAY_JOB_ID", warm_workers.WARM_CODE_ENV)}
    env = {**base, "RAY_JOB_ID": "ffffffff", warm_workers.WARM_CODE_ENV: warm_workers.code_fingerprint()}
    code = "import sys, time\nwhile time.process_time() < 1.0:\n    pass\nsys.stdin.read()"
    kid = subprocess.Popen(["bash", "-c", f"exec -a ray::IDLE {sys.executable} -c '{code}'"], stdin=subprocess.PIPE,
                           env=env)
    try:
        t0 = time.monotonic()
        assert warm_workers.wait_ready(str(tmp_path), 1, timeout=60) == 1
        waited = time.monotonic() - t0
        cpu = proc_cpu_seconds(kid.pid)
        assert cpu is not None and cpu >= 0.95 and waited >= 0.95, (cpu, waited)  # after the computing, not at the title
    finally:
        kid.stdin.close()
        kid.wait(timeout=30)
    assert proc_cpu_seconds(kid.pid) is None  # gone


def test_refill_counts_just_forked_workers_and_never_asks_for_more_than_missing(tmp_path, monkeypatch):
    """A worker the raylet has just forked shows no code for a moment: the refill counts it as one of its own
    (asking again for it started a fourth worker for three wanted), waits for what it asked for to show up,
    and stops once the workers it wanted are ready."""
    fp = warm_workers.code_fingerprint()
    states = iter([
        ({}, {}),  # nothing yet: ask for 3
        ({}, {101: None}), ({}, {101: None, 102: None}),  # two forked, code not visible yet; the third dropped
        ({}, {101: None, 102: None}), ({}, {101: None, 102: None}),
        ({101: fp, 102: fp}, {}),  # ready: ask for the one missing
        ({101: fp, 102: fp}, {103: None}),
        ({101: fp, 102: fp}, {103: fp}),
        ({101: fp, 102: fp, 103: fp}, {}),
    ])
    last = [({}, {})]

    def scripted(raylet):
        last[0] = next(states, last[0])
        return last[0]

    asks = []
    monkeypatch.setattr(warm_workers, "_raylet_pid", lambda temp_dir: os.getpid())
    monkeypatch.setattr(warm_workers, "idle_workers", scripted)
    monkeypatch.setattr(warm_workers, "_prestart", lambda port, n, fingerprint: asks.append(n))
    monkeypatch.setattr(warm_workers, "PRESTART_GRACE_S", 0.5)
    assert warm_workers.refill(str(tmp_path), 1, 3, deadline_s=60, log=lambda *a: None) == 3
    assert asks == [3, 1]


#: a process that joins a cluster as a run (the runs lock of the temp dir in argv[1]) and waits on its stdin
RUN_HOLDER = """
import sys
from fedray.core import warm_workers
assert warm_workers.hold_run_lock(sys.argv[1])
print("held", flush=True)
sys.stdin.read()
"""


def test_a_run_holds_the_cluster_until_its_process_ends(tmp_path):
    """The runs lock is held while a run's process lives, however it ends (here SIGKILL), and by this process
    between hold_run_lock and release_run_lock."""
    assert not warm_workers.runs_active(str(tmp_path))
    kid = subprocess.Popen([sys.executable, "-c", RUN_HOLDER, str(tmp_path)], stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
    try:
        assert kid.stdout.readline().strip() == "held"
        assert warm_workers.runs_active(str(tmp_path))
        assert warm_workers.runs_active(str(tmp_path))  # testing the lock leaves it as it was
    finally:
        kid.kill()
        kid.wait(timeout=30)
    assert not warm_workers.runs_active(str(tmp_path))
    try:
        assert warm_workers.hold_run_lock(str(tmp_path))
        assert warm_workers.runs_active(str(tmp_path))
    finally:
        warm_workers.release_run_lock()
    assert not warm_workers.runs_active(str(tmp_path))
    assert not warm_workers.runs_active(str(tmp_path / "gone"))  # no temp dir: nothing to wait for


def test_refill_asks_for_nothing_while_a_run_holds_the_cluster(tmp_path, monkeypatch):
    """While a run holds the cluster (it starts, or trains), the refill starts no worker beside it: it waits,
    without counting the wait against its deadline, and asks for the missing workers once the runs end."""
    fp = warm_workers.code_fingerprint()
    runs = iter([True] * 6)  # six looks with a run going on, then none
    asks = []
    monkeypatch.setattr(warm_workers, "_raylet_pid", lambda temp_dir: os.getpid())
    monkeypatch.setattr(warm_workers, "idle_workers", lambda raylet: ({101: fp} if asks else {}, {}))
    monkeypatch.setattr(warm_workers, "runs_active", lambda temp_dir: next(runs, False))
    monkeypatch.setattr(warm_workers, "_prestart", lambda port, n, fingerprint: asks.append(n))
    monkeypatch.setattr(warm_workers, "_await_new", lambda *a: None)
    monkeypatch.setattr(warm_workers, "RUNS_POLL_S", 0.05)
    lines = []
    # a deadline shorter than the runs last: the refill still asks once they are over
    assert warm_workers.refill(str(tmp_path), 1, 1, deadline_s=0.2, log=lines.append) == 1
    assert asks == [1] and next(runs, "done") == "done"
    assert lines.count("[fedray] refill: waiting for the cluster's runs to end") == 1


def test_a_run_lets_go_of_the_cluster_before_it_asks_for_its_refill(tmp_path, monkeypatch):
    """At a warm run's exit the refill it spawns must find the cluster free (it asks for the workers at once,
    before the next run holds the lock), so the run releases the lock first."""
    seen = []
    monkeypatch.setattr(warm_workers, "spawn_refill", lambda rec: seen.append(warm_workers.runs_active(rec["temp_dir"])))
    try:
        assert warm_workers.hold_run_lock(str(tmp_path))
        warm_workers.refill_at_exit({"temp_dir": str(tmp_path)})
    finally:
        warm_workers.release_run_lock()
    assert seen == [False]
