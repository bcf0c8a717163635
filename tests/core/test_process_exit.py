"""fedray.core.process_exit.leave: the interpreter's exit steps that matter, without its teardown; and the
``fedray`` command ending through it with its exit status and its outputs whole."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from tests.helpers import write_tiny_config

SCRIPT = textwrap.dedent("""
    import atexit, sys, threading, time
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    from fedray.core.process_exit import leave

    out = Path(sys.argv[1])

    def late_thread():
        time.sleep(0.3)  # still running when leave() is called: it is joined first
        (out / "thread.txt").write_text("joined")

    threading.Thread(target=late_thread).start()
    pool = ThreadPoolExecutor(1)  # never shut down: the threading shutdown stops it, as at a normal exit
    pool.submit(lambda: (time.sleep(0.2), (out / "executor.txt").write_text("ran")))
    atexit.register(lambda: (out / "atexit.txt").write_text("thread.txt" if (out / "thread.txt").exists() else "-"))
    sys.stdout.write("buffered, no newline")  # a pipe: block-buffered until the flush
    leave(3)
    (out / "after.txt").write_text("leave returned")
""")


def test_leave_joins_threads_runs_atexit_flushes_and_exits_with_the_code(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert proc.stdout == "buffered, no newline"
    assert (tmp_path / "thread.txt").read_text() == "joined"
    assert (tmp_path / "executor.txt").read_text() == "ran"
    assert (tmp_path / "atexit.txt").read_text() == "thread.txt"  # after the join, as in Py_FinalizeEx
    assert not (tmp_path / "after.txt").exists()


def test_the_fedray_command_leaves_through_it_with_its_status_and_outputs(tmp_path):
    """`python -m fedray` ends through console(): a usage error keeps its status 2, and a finished in-process run
    has written its summary, metrics and final weights before the process ends."""
    bad = subprocess.run([sys.executable, "-m", "fedray", "run"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "give a CONFIG file" in bad.stderr
    cfg = write_tiny_config(tmp_path)
    ok = subprocess.run([sys.executable, "-m", "fedray", "run", str(cfg), "--quiet"], capture_output=True, text=True,
                        timeout=300)
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert ok.stdout.rstrip().endswith(f"run directory: {tmp_path / 'runs' / 'tiny'}")
    rd = tmp_path / "runs" / "tiny"
    assert json.loads((rd / "run.json").read_text())["status"] == "finished"
    assert json.loads((rd / "summary.json").read_text())["round"] == 2
    assert len((rd / "metrics.jsonl").read_text().splitlines()) == 2
    assert (rd / "final_weights.npy").stat().st_size > 0
