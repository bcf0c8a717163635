"""fedray/core/ray_env.py: the local Ray fedray starts is locked down (loopback only, token auth on), and
fedray joins exactly the cluster it is told to, fast or with a clear error.

One `ray start --head` (loopback, token auth, its own --temp-dir and ports) serves the whole module.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import ray  # noqa: F401  (puts Ray's vendored psutil on sys.path)
import yaml

from tests.helpers import ROOT, free_port, ray_head_env, small_config, start_ray_head, terminate_matching

pytestmark = pytest.mark.ray

_CONNECT = ("import ray; from fedray.core.ray_env import ensure_ray; ensure_ray({arg}); "
            "print('GCS', ray.get_runtime_context().gcs_address)")


def _is_loopback(ip: str) -> bool:
    addr = ipaddress.ip_address(ip.split("%")[0])
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return addr.is_loopback


def _listening(procs) -> list[tuple[str, str, int]]:
    import psutil  # noqa: I001  (Ray's vendored copy: importable once ray is)

    out = []
    for p in procs:
        try:
            out += [(p.name(), c.laddr.ip, c.laddr.port) for c in p.net_connections(kind="inet")
                    if c.status == psutil.CONN_LISTEN]
        except psutil.Error:
            continue
    return out


def _python(code: str, env: dict, timeout: float = 120) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=timeout,
                       cwd=ROOT)
    return r, time.perf_counter() - t0


def _client_env(**over) -> dict:
    """A client's environment: the tests' settings, minus anything that would name a cluster or a token."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(over)
    return env


# --------------------------------------------------------------------------------------- the local start
def test_local_ray_listens_on_loopback_only(ray_session):
    """Every port of every process of the session's fedray-started Ray (this driver, GCS, raylet, agents,
    workers) is bound to 127.0.0.0/8 or ::1."""
    import psutil

    @ray_session.remote
    def ping():
        return 1

    assert ray_session.get([ping.remote() for _ in range(4)]) == [1] * 4  # workers are up too
    me = psutil.Process()
    socks = _listening([me, *me.children(recursive=True)])
    names = {name for name, _, _ in socks}
    assert {"gcs_server", "raylet"} <= names, socks  # the check saw Ray's servers
    wide = [s for s in socks if not _is_loopback(s[1])]
    assert not wide, f"Ray ports on non-loopback addresses: {wide}"
    assert ray_session.get_runtime_context().gcs_address.startswith("127.0.0.1:")


def test_local_ray_starts_no_monitor_or_api_server(ray_session):
    """fedray's private local Ray (the session's, started by ``ensure_ray``) runs without the autoscaler
    monitor and the dashboard's API server, and with everything else: GCS, raylet, both agents, the log
    monitor. Fails on a plain ``ray.init`` (both are started) and on a Ray whose hooks changed."""
    import psutil
    import ray._private.worker as ray_worker
    from ray._private import ray_constants as rc

    started = set(ray_worker._global_node.all_processes)
    assert rc.PROCESS_TYPE_MONITOR not in started and rc.PROCESS_TYPE_DASHBOARD not in started, started
    assert {rc.PROCESS_TYPE_GCS_SERVER, rc.PROCESS_TYPE_RAYLET, rc.PROCESS_TYPE_LOG_MONITOR} <= started, started
    me = psutil.Process()
    cmdlines = [" ".join(p.cmdline()) for p in me.children(recursive=True) if p.is_running()]
    scripts = {s for s in ("dashboard/dashboard.py", "autoscaler/_private/monitor.py", "dashboard/agent.py",
                           "runtime_env/agent/main.py", "_private/log_monitor.py")
               if any(s in c for c in cmdlines)}
    assert scripts == {"dashboard/agent.py", "runtime_env/agent/main.py", "_private/log_monitor.py"}, cmdlines


class _FakeNodeInfo:
    def __init__(self, state):
        self.state = state


class _FakeId:
    def __init__(self, h):
        self._h = h

    def hex(self):
        return self._h


class _FakeGcs:
    """Answers ``get_all_node_info`` from a script: a list of node tables, or an exception to raise."""

    def __init__(self, answers):
        self.answers, self.calls = list(answers), 0

    def get_all_node_info(self, timeout=None):
        self.calls += 1
        a = self.answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return a


class _FakeNode:
    node_id = "ab12"

    def __init__(self, gcs):
        self.gcs = gcs

    def get_gcs_client(self):
        return self.gcs


def test_await_raylet_polls_until_the_node_is_alive():
    """The lean head waits for its raylet's registration in short polls (Ray's own wait retries once a second):
    an absent node, then one not yet alive, then alive; another node's entry does not count."""
    from fedray.core.ray_env import _await_raylet

    alive, dead = _FakeNodeInfo(0), _FakeNodeInfo(1)
    gcs = _FakeGcs([{}, {_FakeId("ab12"): dead, _FakeId("cd34"): alive}, {_FakeId("ab12"): alive}, {}])
    t = time.perf_counter()
    _await_raylet(_FakeNode(gcs), poll_s=0.001)
    assert gcs.calls == 3 and time.perf_counter() - t < 0.5


def test_await_raylet_leaves_trouble_to_rays_own_wait():
    """A GCS call that fails, or a node without a GCS client, returns at once: Node.__init__'s loop follows."""
    from fedray.core.ray_env import _await_raylet

    gcs = _FakeGcs([RuntimeError("GCS unavailable"), {}])
    _await_raylet(_FakeNode(gcs), poll_s=0.001)
    assert gcs.calls == 1
    _await_raylet(object())  # no get_gcs_client
    gcs = _FakeGcs([{}] * 1000)
    _await_raylet(_FakeNode(gcs), timeout_s=0.05, poll_s=0.01)  # never registers: gives up at the timeout
    assert 2 <= gcs.calls < 20


def test_lean_head_waits_for_its_raylet_in_short_polls():
    """The lean head class overrides ``start_ray_processes`` (which Node.__init__ calls before its own wait)."""
    import ray._private.node as ray_node

    from fedray.core.ray_env import _lean_head_class

    lean = _lean_head_class(ray_node.Node)
    assert lean is not None and "start_ray_processes" in vars(lean)


_KILLED_DRIVER = """
import ray
from fedray.core.procinfo import proc_children
from fedray.core.ray_env import ensure_ray
ensure_ray(1 << 28, num_cpus=1, log_to_driver=False)
raylet = ray._private.worker._global_node.all_processes["raylet"][0].process.pid
print(" ".join(map(str, [raylet, *proc_children(raylet)])), flush=True)
import time
time.sleep(600)
"""


def test_private_ray_ends_with_a_driver_killed_by_sigkill():
    """A driver that started the private local Ray and is then killed with SIGKILL leaves none of the raylet's
    processes running: Ray 2.60's dashboard and runtime-env agents outlived such a driver by minutes (they
    wait on the dead GCS), until fedray's reaper (``ray_env._reap_agents_after``) ends them."""
    from fedray.core.procinfo import proc_runs, proc_start_ticks

    env = _client_env()
    env.pop("FEDRAY_NO_WARM", None)
    p = subprocess.Popen([sys.executable, "-c", _KILLED_DRIVER], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         env=env, text=True)
    try:
        pids = [int(x) for x in p.stdout.readline().split()]
    finally:
        p.kill()
        p.wait()
    assert len(pids) >= 3, pids  # the raylet, its dashboard agent and its runtime-env agent
    marks = {pid: proc_start_ticks(pid) for pid in pids}

    def running():
        return [pid for pid, start in marks.items() if proc_runs(pid, start)]

    deadline = time.monotonic() + 30
    while running() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not running(), f"still running 30 s after the driver was killed: {running()}"


def test_local_ray_keeps_token_auth_on(ray_session):
    """The session's Ray runs with RAY_AUTH_MODE=token and fedray's 0600 token; a client without the token,
    or with another one, is refused within seconds with a message saying what to set."""
    assert os.environ["RAY_AUTH_MODE"] == "token"
    token = Path(os.environ["RAY_AUTH_TOKEN_PATH"])
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    gcs = ray_session.get_runtime_context().gcs_address

    r, took = _python(_CONNECT.format(arg=f"address={gcs!r}"), _client_env())
    assert r.returncode != 0 and took < 30, (took, r.stdout[-2000:], r.stderr[-2000:])
    assert "RayConnectError" in r.stderr and gcs in r.stderr and "RAY_AUTH_MODE=token" in r.stderr, r.stderr[-2000:]

    with tempfile.TemporaryDirectory() as d:
        wrong = Path(d) / "token"
        wrong.write_text("0" * 64)
        r, took = _python(_CONNECT.format(arg=f"address={gcs!r}"),
                          _client_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(wrong)))
    assert r.returncode != 0 and took < 30, (took, r.stderr[-2000:])
    assert "refused" in r.stderr and str(wrong) in r.stderr, r.stderr[-2000:]


def test_token_file_is_private_and_reused(tmp_path, monkeypatch):
    from fedray.core.ray_env import local_ray_env, local_token_path

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    env = local_ray_env()
    path = local_token_path()
    assert env == {"RAY_AUTH_MODE": "token", "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
                   "RAY_AUTH_TOKEN_PATH": str(path)}
    assert path.is_relative_to(tmp_path) and len(path.read_text()) == 64
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    first = path.read_text()
    path.chmod(0o644)
    local_ray_env()
    assert path.read_text() == first and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_malformed_addresses_are_refused_clearly():
    from fedray.core.ray_env import RayConnectError, _connect

    with pytest.raises(RayConnectError, match=r"http://127\.0\.0\.1:8265 is a dashboard"):
        _connect(None, "http://127.0.0.1:8265", True, {})
    with pytest.raises(RayConnectError, match="not HOST:PORT"):
        _connect(None, "127.0.0.1", True, {})


# --------------------------------------------------------------------------------------- a `ray start` head
@pytest.fixture(scope="module")
def head():
    base = tempfile.mkdtemp(prefix="frh-", dir="/tmp")
    temp = os.path.join(base, "ray")  # Ray's default temp dir when RAY_TMPDIR=base: `ray start` records
    env = ray_head_env()              # the head in temp/ray_current_cluster, where a plain ray.init() looks
    addr = start_ray_head(temp, env, "--num-cpus=1", "--include-dashboard=false")
    session = Path(temp, "session_latest").resolve()  # the head's (a local Ray started later moves the link)
    yield {"temp": temp, "tmpdir": base, "session": session, "env": env, **addr}
    terminate_matching(temp, addr["gcs"])
    shutil.rmtree(base, ignore_errors=True)


def _drivers_of(head: dict, pid: int) -> list[Path]:
    """The head's log files of a driver process ``pid`` (a driver that joined the head writes one)."""
    return list(head["session"].glob(f"logs/python-core-driver-*_{pid}.log"))


def test_head_listens_on_loopback_only(head):
    """cluster/README.md's local-head recipe (the settings of ray_head_env) binds nothing but 127.0.0.1."""
    import psutil

    from tests.helpers import pids_matching

    roots = [psutil.Process(p) for p in pids_matching(head["temp"])]
    procs = {p.pid: p for r in roots for p in [r, *r.children(recursive=True)]}.values()
    socks = _listening(procs)
    assert {"gcs_server", "raylet"} <= {name for name, _, _ in socks}, socks
    assert not [s for s in socks if not _is_loopback(s[1])], socks


def test_join_loopback_head_by_ray_address(head):
    """RAY_ADDRESS=127.0.0.1:PORT of a loopback-only head with token auth: joined, at that address."""
    r, took = _python(_CONNECT.format(arg=""), _client_env(**{k: head["env"][k] for k in
                                                             ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")},
                                                          RAY_ADDRESS=head["gcs"]))
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"GCS {head['gcs']}" in r.stdout
    assert took < 60


@pytest.fixture
def tiny_config(tmp_path, partition_cache) -> Path:
    cfg = small_config(tmp_path, partition_cache, train__rounds=1, train__clients_per_round=2,
                       engine__backend="ray", engine__num_workers=1)
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _fedray_run(env: dict, *args: str) -> tuple[subprocess.Popen, str, str, float]:
    t0 = time.perf_counter()
    p = subprocess.Popen([sys.executable, "-m", "fedray", "run", *args, "-q"], env=env, cwd=ROOT,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=300)
    return p, out, err, time.perf_counter() - t0


def test_fedray_run_address_joins_that_head(head, tiny_config):
    env = _client_env(**{k: head["env"][k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")})
    p, out, err, _ = _fedray_run(env, str(tiny_config), "--address", head["gcs"])
    assert p.returncode == 0, out[-2000:] + err[-3000:]
    assert _drivers_of(head, p.pid), "fedray run --address did not join the head"


def test_plain_fedray_run_does_not_attach_to_a_running_head(head, tiny_config):
    """A `ray start --head` is running and recorded where Ray looks (a plain ``ray.init()`` joins it, checked
    first); `fedray run` without any address starts its own Ray instead of joining it."""
    env = _client_env(RAY_TMPDIR=head["tmpdir"], **{k: head["env"][k] for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH")})
    r, _ = _python("import ray; ray.init(); print('GCS', ray.get_runtime_context().gcs_address)",
                   {**env, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"})
    assert f"GCS {head['gcs']}" in r.stdout, r.stderr[-3000:]  # the trap is set
    p, out, err, _ = _fedray_run(env, str(tiny_config))
    assert p.returncode == 0, out[-2000:] + err[-3000:]
    assert not _drivers_of(head, p.pid), "a plain fedray run joined the running head"


def test_unreachable_address_fails_fast(tiny_config):
    port = free_port()  # nothing listens there
    p, out, err, took = _fedray_run(_client_env(), str(tiny_config), "--address", f"127.0.0.1:{port}")
    assert p.returncode == 2, out[-2000:] + err[-3000:]
    assert f"127.0.0.1:{port}" in err and "no Ray cluster answers" in err, err[-3000:]
    assert took < 60, took  # start-up (imports, data) plus a 5 s check, not Ray's minutes of retries
