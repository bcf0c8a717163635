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
    import fedray.driver.launch as launch

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


RERUN = textwrap.dedent("""
    import json, sys
    import fedray.driver.launch as launch

    def early_start(*args, **kwargs):  # Ray's start (in the background) would begin here
        print("EARLY START", flush=True)
        sys.exit(99)

    launch.early_start = early_start
    config, heavy, entry, *extra = sys.argv[1:]
    if entry == "fedray":
        from fedray.cli import main
        rc = main(["run", config, *extra])
    else:  # the entry point of `ray job submit`
        from jobs.train import main
        rc = main(["--config", config, *extra])
    print(json.dumps({"rc": rc, "imported": sorted(m for m in heavy.split(",") if m in sys.modules)}))
""")


def _rerun(config, entry: str, *extra: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    """``fedray run CONFIG`` / ``jobs.train --config CONFIG`` with Ray's early start replaced by an exit 99: the
    process and, when the command returned, its exit status and the heavy modules it imported."""
    proc = subprocess.run([sys.executable, "-c", RERUN, str(config), ",".join(HEAVY), entry, *extra],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    last = proc.stdout.strip().splitlines()[-1:] or [""]
    return proc, json.loads(last[0]) if last[0].startswith("{") else None


def test_a_finished_run_s_rerun_prints_its_table_and_starts_nothing(tmp_path):
    """Make-like: `fedray run CONFIG` (and `jobs.train`) whose run directory holds this config's finished run
    prints that run's result table, says nothing was run and how to run it again, and exits 0, before Ray's
    early start and without torch, Ray or the data. A failed or interrupted run there is refused as before,
    also before Ray starts; --overwrite and --resume go on to the run."""
    cfg = write_tiny_config(tmp_path, "ray", rounds=1)
    first = subprocess.run([sys.executable, "-m", "fedray", "run", str(cfg), "engine.backend=local"],
                           capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert first.returncode == 0, first.stderr[-2000:]
    table = first.stdout.split("run directory:")[0].strip().splitlines()[-3:]  # the result table's lines
    run = tmp_path / "runs" / "tiny"
    for entry in ("fedray", "jobs.train"):
        proc, out = _rerun(cfg, entry, "engine.backend=local")
        assert out == {"rc": 0, "imported": []}, proc.stdout + proc.stderr[-2000:]
        assert "EARLY START" not in proc.stdout
        assert "\n".join(table) in proc.stdout  # the same table as at the end of the run
        assert "already holds this config's finished run: nothing was run" in proc.stderr
        assert "--overwrite" in proc.stderr
        assert proc.stdout.strip().splitlines()[-2] == f"run directory: {run.resolve() if entry != 'fedray' else run}"
    # the same output.name with another config: not this run, refused
    proc, out = _rerun(cfg, "fedray", "engine.backend=local", "train.rounds=2")
    assert out["rc"] == 2 and not {"ray", "torch"} & set(out["imported"]) and "EARLY START" not in proc.stdout
    assert re.search(r"already holds a run \(status finished\) of another config .*--resume.*--overwrite", proc.stderr)

    info = json.loads((run / "run.json").read_text())
    for status in ("failed", "interrupted"):
        (run / "run.json").write_text(json.dumps({**info, "status": status}))
        for entry in ("fedray", "jobs.train"):
            proc, out = _rerun(cfg, entry, "engine.backend=local")
            assert out and out["rc"] == 2, proc.stdout + proc.stderr[-2000:]
            assert not {"ray", "torch"} & set(out["imported"])  # (pyarrow: the error's own report imports it)
            assert "EARLY START" not in proc.stdout
            assert re.search(rf"already holds a run \(status {status}\); continue it with .*--resume.*--overwrite",
                             proc.stderr)
    (run / "run.json").write_text(json.dumps(info))
    for entry in ("fedray", "jobs.train"):  # --overwrite: the run goes on (to Ray's start)
        proc, _ = _rerun(cfg, entry, "--overwrite")
        assert proc.returncode == 99 and "EARLY START" in proc.stdout, proc.stderr[-2000:]
    assert json.loads((run / "run.json").read_text())["status"] == "finished"  # nothing deleted before the run
    resume = subprocess.run([sys.executable, "-c", RERUN.replace('main(["run", config, *extra])',
                                                                 'main(["run", "--resume", config])'),
                             str(run), ",".join(HEAVY), "fedray"], capture_output=True, text=True, timeout=120,
                            cwd=ROOT)
    assert resume.returncode == 99 and "EARLY START" in resume.stdout, resume.stderr[-2000:]


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
