"""The ``fedray`` command's start: its parser and everything ``fedray run`` does before Ray's early start import
none of the heavy libraries (a cold run starts Ray while torch loads, so an import before that point is paid
in full: the ``tune`` subparser once pulled torch in through the registries, 2.5 s before Ray started, and
``fedray --help`` took 3.6 s); and the start-up ``fedray run`` reports counts from its process's start. The same for ``jobs.train``, the
entry point of ``ray job submit``."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import write_tiny_config

ROOT = Path(__file__).resolve().parents[1]

HEAVY = ("torch", "ray", "pandas", "pyarrow", "optuna", "sklearn")

BEFORE_EARLY_START = textwrap.dedent("""
    import json, sys
    import fedray.engine.launch as launch

    class Reached(Exception):
        pass

    def early_start(*args, **kwargs):  # what was imported when `fedray run` starts Ray
        print(json.dumps(sorted(m for m in sys.argv[2].split(",") if m in sys.modules)))
        raise Reached

    launch.early_start = early_start
    if sys.argv[3] == "fedray":
        from fedray.cli import main
        argv = ["run", sys.argv[1], "train.rounds=1"]
    else:  # the entry point of `ray job submit`
        from jobs.train import main
        argv = ["--config", sys.argv[1], "train.rounds=1"]
    try:
        main(argv)
    except Reached:
        pass
""")


@pytest.mark.parametrize("entry", ["fedray", "jobs.train"])
def test_fedray_run_imports_nothing_heavy_before_it_starts_ray(tmp_path, entry):
    proc = subprocess.run([sys.executable, "-c", BEFORE_EARLY_START, str(write_tiny_config(tmp_path, "ray", rounds=1)), ",".join(HEAVY),
                           entry], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_the_whole_parser_imports_nothing_heavy():
    """``fedray --help`` (every subcommand's parser, ``tune``'s and ``sweep``'s included)."""
    code = ("import sys; from fedray.cli import build_parser; build_parser(); "
            f"print([m for m in {HEAVY!r} if m in sys.modules])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def _reported_start_up(argv: list[str]) -> tuple[float, float]:
    """(the start-up the "start-up X s" line of the command ``argv`` reports, the seconds from its spawn to
    that line as seen from here)."""
    t_spawn = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    reported = seen = None
    for line in proc.stdout:
        m = re.search(r"start-up ([\d.]+) s", line)
        if m and reported is None:
            seen, reported = time.perf_counter() - t_spawn, float(m.group(1))
    assert proc.wait(timeout=300) == 0
    assert reported is not None
    return reported, seen


def test_reported_start_up_counts_from_the_process_start(tmp_path):
    """The "start-up X s" line of `fedray run`: X is the time from the process's start to the line (imports,
    parser and data included), not from some point after the imports."""
    reported, seen = _reported_start_up([sys.executable, "-m", "fedray", "run",
                                         str(write_tiny_config(tmp_path, "local", rounds=1))])
    assert seen - 0.5 <= reported <= seen + 0.1, (reported, seen)


def test_reported_start_up_leaves_out_what_a_shell_did_before_it_exec_d_fedray(tmp_path):
    """scripts/demo.sh runs its set-up and then execs `fedray` in the same process, whose start /proc keeps
    (exec keeps the pid): the 2 s the shell spent first are not fedray's start-up, the interpreter's are."""
    cfg = write_tiny_config(tmp_path, "local", rounds=1)
    reported, seen = _reported_start_up(["bash", "-c", f"sleep 2; exec {shlex.quote(sys.executable)} -m fedray run "
                                                       f"{shlex.quote(str(cfg))}"])
    assert seen - 2.6 <= reported <= seen - 1.95, (reported, seen)


def test_proc_age_seconds():
    from fedray.core.procinfo import proc_age_seconds

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        age = proc_age_seconds(child.pid)
        assert age is not None and 0.0 <= age < 0.5
        assert proc_age_seconds() > age  # this test process started before its child
    finally:
        child.communicate("")
    assert proc_age_seconds(2**22 + 1) is None  # above the kernel's pid limit: no such process


WHOLE_RAY_RUN = textwrap.dedent("""
    import json, sys
    from fedray.cli import main

    rc = main(["run", sys.argv[1], "output.tensorboard=true", "output.checkpoint_every=1"])
    print(json.dumps({"rc": rc, "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))}))
""")


@pytest.mark.ray
def test_a_ray_run_s_driver_never_imports_torch(tmp_path):
    """The driver of a Ray run (checks on the coordinator actor, workers started from a torch-free module,
    checkpoints, TensorBoard and the final weights as numpy) imports no torch: a cold run's 2 cores are
    busy starting Ray and the actors, each of which imports torch itself (1.7 CPU-s apiece)."""
    proc = subprocess.run([sys.executable, "-c", WHOLE_RAY_RUN, str(write_tiny_config(tmp_path, "ray", rounds=2))],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"rc": 0, "torch": []}
    run = tmp_path / "runs" / "tiny"
    assert (run / "final_weights.npy").is_file() and list((run / "tb").glob("events.out.tfevents.*"))
    assert json.loads((run / "run.json").read_text())["status"] == "finished"
