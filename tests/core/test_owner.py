"""fedray.core.owner: whether the driver a record names still lives (pid, host, process start, boot id)."""

from __future__ import annotations

import socket
import subprocess
import sys

from fedray.core.owner import describe_device, device_kinds, owner_record, owner_state, settle_sessions, settled_status
from fedray.core.procinfo import proc_start_ticks


def _owner_of(proc: subprocess.Popen) -> dict:
    return {**owner_record(), "pid": proc.pid, "start_ticks": proc_start_ticks(proc.pid)}


def test_an_owner_is_alive_until_it_dies_and_a_reused_pid_is_not_it():
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        owner = _owner_of(proc)
        assert owner_state(owner) == "alive" and settled_status("running", owner) == ("running", None)
        assert owner_state({**owner, "start_ticks": owner["start_ticks"] + 1}) == "dead"  # another process, same pid
    finally:
        proc.kill()
        proc.wait()
    assert owner_state(owner) == "dead"
    status, reason = settled_status("running", owner)
    assert status == "killed" and f"its driver (pid {proc.pid} on {socket.gethostname()})" in reason
    assert settled_status("failed", owner) == ("failed", None)  # only "running" is settled


def test_what_cannot_be_seen_from_here_is_unknown_and_a_reboot_ends_every_owner():
    me = owner_record()
    assert owner_state(me) == "alive"
    assert owner_state({**me, "host": "another-host"}) == "unknown"
    assert owner_state(None) == "unknown" and owner_state({"host": me["host"]}) == "unknown"
    if me["boot_id"]:
        assert owner_state({**me, "boot_id": "an-earlier-boot"}) == "dead"


def test_sessions_left_running_are_settled_under_the_lock_and_others_kept():
    me = owner_record()
    other_host = {**me, "host": "another-host", "status": "running"}
    reused = {**me, "status": "running"}  # this host, a pid that runs (this process): under the lock, a dead driver's
    done = {**me, "status": "finished"}
    sessions = [other_host, reused, done]
    assert settle_sessions(sessions, lock_held=False) == []
    assert settle_sessions(sessions, lock_held=True) == [reused]
    assert [s["status"] for s in sessions] == ["running", "killed", "finished"] and "reason" in reused


def test_device_records_in_words_and_kinds():
    cpu = {"coordinator": "cpu", "workers": ["cpu"]}
    split = {"coordinator": "cpu", "workers": ["cuda (NVIDIA H200)", "cuda (NVIDIA A100)"]}
    assert describe_device(cpu) == "cpu" and device_kinds(cpu) == {"cpu"}
    assert describe_device(split) == "coordinator cpu, workers cuda (NVIDIA H200), cuda (NVIDIA A100)"
    assert device_kinds(split) == {"cpu", "cuda"}
