"""Starting or joining Ray, in one place (``fedray run``, sweeps, studies, jobs).

Two cases, nothing in between:

* **An address is named** (``fedray run --address``, ``engine.ray_address``, ``RAY_ADDRESS``; in that
  order): fedray joins exactly that cluster. A short check first (TCP, then one GCS call carrying the
  token the way ``ray.init`` would) turns an unreachable address or a missing/wrong token into a
  ``RayConnectError`` within seconds, naming the address and what to set, instead of Ray's bare
  ``ConnectionError`` after ~20 s or its endless retry. A loopback address (``127.0.0.1:PORT``,
  ``localhost:PORT``) is kept on loopback: Ray would otherwise rewrite it to the machine's outward IP,
  where a loopback-only cluster does not answer.
* **No address**: fedray starts a private local instance (``address="local"``), never a ``ray start``
  cluster Ray recorded on the machine. It is locked down: every Ray process binds 127.0.0.1 only (Ray's
  single-node switch ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, which pins the node IP to loopback; a plain
  ``--node-ip-address=127.0.0.1`` is rewritten by Ray to the outward IP and binds every interface), and
  token authentication stays on (``RAY_AUTH_MODE=token``) with the token from ``RAY_AUTH_TOKEN`` /
  ``RAY_AUTH_TOKEN_PATH`` when set, else fedray's own token file (``local_token_path()``, mode 0600,
  generated once).

``local_ray_env()`` gives the same settings as environment variables, for a ``ray start --head`` that
should match (the job tests, cluster/README.md's local head).

A third case is asked for by name: ``warm=True`` (``fedray run`` does, unless ``--no-warm`` or
``FEDRAY_NO_WARM=1``) with no address joins the loopback Ray that ``fedray up`` started and recorded in
``warm_record_path()`` (:mod:`fedray.core.ray_up`), with the token it recorded, and says so in one line.
Only that recorded cluster, never another one running on the machine; a record whose cluster is gone is
dropped with a notice and fedray starts its own local Ray as usual. The job then carries the fingerprint
of its code (:mod:`fedray.core.warm_workers`), so its actors start in the cluster's idle workers of the
same code, and refills those as the process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import json
import logging
import os
import secrets
import socket
import stat
import sys
import time
from pathlib import Path

from fedray.core import warm_workers

__all__ = ["RayConnectError", "current_node_id", "ensure_ray", "local_ray_env", "local_token_path", "read_warm_record",
           "warm_record_path"]

logger = logging.getLogger("fedray")

#: Ray's switch that pins the node IP to loopback (named for Windows/macOS, honoured on every platform).
LOOPBACK_SWITCH = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
CONNECT_TIMEOUT_S = 5.0
#: The fedray package this process runs (a `fedray up` cluster records the one its workers import).
FEDRAY_DIR = Path(__file__).resolve().parents[1]
#: ``ray.init`` arguments that make sense when joining a cluster (the rest size a local instance).
_CONNECT_KWARGS = {"configure_logging", "logging_level", "logging_format", "namespace", "runtime_env"}


class RayConnectError(ConnectionError):
    """The named Ray cluster cannot be joined (unreachable, refused the token, or a malformed address)."""


# ------------------------------------------------------------------------------------------- local token
def _cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")) / "fedray"


def local_token_path() -> Path:
    """fedray's token file for the Ray instances it starts: ``$XDG_CACHE_HOME/fedray/ray/auth_token``
    (``~/.cache/...`` by default)."""
    return _cache_root() / "ray" / "auth_token"


def warm_record_path() -> Path:
    """Where ``fedray up`` records its running Ray: ``$XDG_CACHE_HOME/fedray/ray/up.json``."""
    return _cache_root() / "ray" / "up.json"


def _ensure_token_file(path: Path) -> Path:
    """Create ``path`` with a fresh 256-bit token (0600, directory 0700) unless it exists; an existing file
    must belong to this user and is made 0600."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(secrets.token_hex(32))
            try:
                os.link(tmp, path)  # atomic, and never replaces a token another process wrote first
            except FileExistsError:
                pass
        finally:
            tmp.unlink(missing_ok=True)
    st = path.stat()
    if st.st_uid != os.getuid():
        raise PermissionError(f"Ray token file {path} belongs to another user; remove it or set RAY_AUTH_TOKEN_PATH")
    if stat.S_IMODE(st.st_mode) & 0o077:
        path.chmod(0o600)
    if not path.read_text().strip():
        raise PermissionError(f"Ray token file {path} is empty; delete it and fedray generates a new one")
    return path


def local_ray_env() -> dict[str, str]:
    """Environment for a locally started Ray: token auth on, the token fedray uses, nodes on loopback.

    ``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH`` from the environment is kept; otherwise the token is
    ``local_token_path()`` (generated on first use)."""
    env = {"RAY_AUTH_MODE": "token", LOOPBACK_SWITCH: "0"}
    if os.environ.get("RAY_AUTH_TOKEN"):
        return env
    given = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if given:
        if not Path(given).is_file():
            raise FileNotFoundError(f"RAY_AUTH_TOKEN_PATH={given} does not exist; unset it and fedray uses "
                                    f"its own token ({local_token_path()}), or point it at a token file")
        env["RAY_AUTH_TOKEN_PATH"] = given
    else:
        env["RAY_AUTH_TOKEN_PATH"] = str(_ensure_token_file(local_token_path()))
    return env


# ------------------------------------------------------------------------------------------- fedray up's record
def _pid_runs_in(pid: int, marker: str) -> bool:
    """Process ``pid`` is alive and its command line contains ``marker`` (a head's own temp dir)."""
    try:
        with open(f"/proc/{int(pid)}/cmdline", "rb") as f:
            return marker.encode() in f.read()
    except (OSError, ValueError, TypeError):
        return False


def read_warm_record(log=None) -> dict | None:
    """The record of the Ray ``fedray up`` started, when that cluster still runs (its GCS process is alive
    under the recorded temp dir and its port answers); a record whose cluster is gone is removed, with one
    line to ``log``; None without a record."""
    path = warm_record_path()
    try:
        rec = json.loads(path.read_text())
        address, temp, pid = rec["address"], rec["temp_dir"], rec["gcs_pid"]
        host, port = _split_address(address)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, RayConnectError) as e:
        _drop_record(path, f"unreadable ({type(e).__name__}: {e})", log)
        return None
    alive = _pid_runs_in(pid, temp)
    if alive:
        try:
            with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
                pass
        except OSError:
            alive = False
    if not alive:
        _drop_record(path, f"its Ray at {address} is gone", log)
        return None
    here = str(FEDRAY_DIR)
    if rec.get("fedray", here) != here:  # its workers import another checkout's fedray than this driver's
        (log or _warn)(f"[fedray] not using the `fedray up` Ray at {address}: its workers run fedray from "
                       f"{rec['fedray']}, this run's fedray is {here}; starting a local Ray instead "
                       f"(`fedray down` and `fedray up` from this checkout to use a warm Ray)")
        return None
    return rec


def _drop_record(path: Path, why: str, log) -> None:
    path.unlink(missing_ok=True)
    (log or _warn)(f"[fedray] ignoring the `fedray up` record {path}: {why}; starting a local Ray instead")


def _warn(msg: str) -> None:
    logger.warning(msg)


def _connect_warm(ray, rec: dict, log_to_driver: bool, init_kwargs: dict, log) -> None:
    """Join the recorded ``fedray up`` cluster with the token it was started with."""
    if rec.get("token_path"):
        os.environ.pop("RAY_AUTH_TOKEN", None)
        os.environ["RAY_AUTH_TOKEN_PATH"] = rec["token_path"]
    os.environ["RAY_AUTH_MODE"] = "token"
    _refresh_ray_config()
    if rec.get("idle_workers") and rec.get("node_manager_port"):
        # this job's actors may start in the cluster's idle workers of the same code; no refill starts more
        # while it lives (it holds the cluster's runs lock); at exit, refill them
        init_kwargs = {**init_kwargs, "runtime_env": warm_workers.runtime_env(warm_workers.code_fingerprint(),
                                                                             init_kwargs.get("runtime_env"))}
        warm_workers.hold_run_lock(rec["temp_dir"])
        atexit.register(warm_workers.refill_at_exit, rec)
    _connect(ray, rec["address"], log_to_driver, init_kwargs)
    (log or print)(f"[fedray] using the warm Ray of `fedray up` at {rec['address']} (record {warm_record_path()}); "
                   f"`fedray run --no-warm` starts a private one instead, `fedray down` stops it")


# ------------------------------------------------------------------------------------------- Ray settings
def _refresh_ray_config() -> None:
    """Make this process's Ray see the authentication settings now in ``os.environ`` (Ray caches them)."""
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]  # Cython, no stubs

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def _keep_signals_with_python() -> None:
    """No abseil failure-signal handler in this process (the driver). Ray's core worker installs one when this process
    joins Ray, for SIGTERM too: it prints ``*** SIGTERM received``, calls the handler before it and raises the
    signal again, so a SIGTERM between ``ray.init`` and the round loop's own handler ended the driver (exit 1 or
    134, ``run.json`` as it was) instead of running fedray's (``sys.exit(15)``: the run stops as interrupted; found
    by bench/chaos.py). Ray reads ``ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER`` when it creates the core
    worker: set here, in this process only; the environment variable would also reach the processes a local Ray
    starts, whose crash reports stay on."""
    from ray._private import ray_constants

    ray_constants.RAY_DISABLE_FAILURE_SIGNAL_HANDLER = True


def _pin_loopback() -> None:
    """Keep this process's Ray (and the processes it starts) on 127.0.0.1: without this Ray replaces a
    loopback node IP or address by the machine's outward IP."""
    from ray._private import ray_constants

    os.environ[LOOPBACK_SWITCH] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False  # read at import time; ray is imported by now


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit():
        raise RayConnectError(f"Ray address {address!r} is not HOST:PORT (the GCS address of the head, "
                              f"e.g. 127.0.0.1:6379)")
    return host, int(port)


def _auth_hint() -> str:
    if os.environ.get("RAY_AUTH_MODE", "").lower() != "token":
        return ("no token was sent: RAY_AUTH_MODE is not 'token'. Set RAY_AUTH_MODE=token and "
                "RAY_AUTH_TOKEN_PATH=<file with the cluster's token> (or RAY_AUTH_TOKEN)")
    src = ("RAY_AUTH_TOKEN" if os.environ.get("RAY_AUTH_TOKEN")
           else os.environ.get("RAY_AUTH_TOKEN_PATH") or str(Path.home() / ".ray" / "auth_token"))
    return (f"the token from {src} is missing or not the cluster's. Point RAY_AUTH_TOKEN_PATH at the "
            f"cluster's token (`ray get-auth-token` on the head prints it) or set RAY_AUTH_TOKEN")


def _check_reachable(address: str, host: str, port: int) -> None:
    """Fail within seconds when nothing answers at ``address`` or the cluster refuses our token."""
    try:
        with socket.create_connection((host, port), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as e:
        raise RayConnectError(
            f"no Ray cluster answers at {address} ({e.strerror or e}). Start one there "
            f"(`ray start --head --port={port}`), or fix --address / engine.ray_address / RAY_ADDRESS; "
            f"without any address fedray starts its own local Ray") from None
    import grpc
    from ray._private.grpc_utils import init_grpc_channel
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    channel = init_grpc_channel(f"{host}:{port}" if ":" not in host else f"[{host}]:{port}")
    try:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(),  # type: ignore[attr-defined]  # protobuf
                          timeout=CONNECT_TIMEOUT_S)
    except grpc.RpcError as e:
        code = e.code() if hasattr(e, "code") else None
        if code == grpc.StatusCode.UNAUTHENTICATED:
            raise RayConnectError(f"the Ray cluster at {address} refused the connection: {_auth_hint()}") from None
        raise RayConnectError(f"{address} accepts connections but does not answer as a Ray GCS "
                              f"({code.name if code else e}): is it the head's GCS port (default 6379), "
                              f"not the dashboard's (8265)?") from None
    finally:
        channel.close()


def current_node_id() -> str | None:
    """The Ray node this process runs on; None where Ray is not imported or not initialized (in-process)."""
    ray = sys.modules.get("ray")
    return ray.get_runtime_context().get_node_id() if ray is not None and ray.is_initialized() else None


# ------------------------------------------------------------------------------------------- entry point
def ensure_ray(object_store_memory: int | None = None, *, address: str | None = None, log_to_driver: bool = True,
               warm: bool = False, log=None, py_modules: list[str] | None = None, **init_kwargs) -> bool:
    """Use the Ray instance this process already joined; else join the cluster named by ``address``
    (``--address`` / ``engine.ray_address``) or ``RAY_ADDRESS``, which must answer; else, with ``warm``, the
    running cluster of ``fedray up`` (one line to ``log`` says so); else start a private, locked-down local
    instance (see the module docstring).

    ``object_store_memory`` and ``init_kwargs`` (``num_cpus``, ...) size a local start only. ``py_modules``: the
    run's plugin code (:func:`fedray.plugins.plugin_py_modules`), shipped with the job's runtime env when joining a
    cluster by address (a local Ray, private or ``fedray up``'s, is on this machine and imports it in place). True when this
    call started a local Ray: its processes are children of the calling *thread* (Ray has them die with
    their parent, which on Linux means that thread), so a thread that started it must outlive it."""
    import ray

    if ray.is_initialized():
        return False
    _keep_signals_with_python()
    address = (address or os.environ.get("RAY_ADDRESS") or "").strip()
    if address and address != "local":
        if py_modules:
            env = dict(init_kwargs.get("runtime_env") or {})
            env["py_modules"] = [*env.get("py_modules", []), *py_modules]
            init_kwargs = {**init_kwargs, "runtime_env": env}
        _connect(ray, address, log_to_driver, init_kwargs)
        return False
    warm = warm and os.environ.get("FEDRAY_NO_WARM", "").strip().lower() not in ("1", "true", "yes")
    rec = read_warm_record(log) if warm and not address else None
    if rec is not None:
        _connect_warm(ray, rec, log_to_driver, init_kwargs, log)
        return False
    env = local_ray_env()
    if os.environ.get("RAY_AUTH_MODE", "token").lower() != "token":
        logger.warning("fedray: RAY_AUTH_MODE=%s ignored: the local Ray fedray starts keeps token authentication on",
                    os.environ["RAY_AUTH_MODE"])
    os.environ.update(env)  # the Ray processes started below inherit it
    _refresh_ray_config()
    _pin_loopback()
    kwargs = dict(address="local", include_dashboard=False, log_to_driver=log_to_driver,
                  _node_ip_address="127.0.0.1")
    if object_store_memory:
        kwargs["object_store_memory"] = int(object_store_memory)
    kwargs.update(init_kwargs)
    _init_lean_head(ray, kwargs)
    return True


def _init_lean_head(ray, kwargs: dict) -> None:
    """``ray.init(**kwargs)`` of a private local instance, without the two head processes such an instance
    never uses: the autoscaler monitor (a single node, no autoscaling config) and the dashboard's API server
    (which, with ``include_dashboard=False``, serves only Ray's usage-stats module, and usage stats are
    off). Ray 2.60 starts both on every ``ray.init``; together they cost about 2.4 CPU-seconds of start-up on
    the same cores the driver and the actors import torch on, the API server is waited for (about 1.3 s)
    before the raylet starts, and both keep polling during the rounds. Everything else starts as usual:
    the GCS, the raylet with its dashboard and runtime-env agents, and the log monitor (workers' output still
    reaches the driver). Ray offers no switch for the two on ``ray.init``, so its node class is swapped for
    a subclass during this one call (``ray start --head`` has ``--no-monitor``; a joined cluster is not ours
    to change). On a Ray without these hooks the start is the plain one. Either way the raylet's agents then
    get a reaper (:func:`_reap_agents_after`).

    One visible trace of the missing API server: the dashboard agent's event module looks for its address
    once a second and logs "Get dashboard http address failed" to the session's ``dashboard_agent.log``
    (about 0.6 kB a second; Ray rotates that log). Nothing reads it; the events it would forward are the
    ones the usage-stats-only API server had no route for anyway."""
    import ray._private.node as ray_node

    base = ray_node.Node
    lean = _lean_head_class(base)
    if lean is None:
        ray.init(**kwargs)
    else:
        ray_node.Node = lean  # type: ignore[misc]  # the lean head replaces Ray's Node class for this start
        try:
            ray.init(**kwargs)
        finally:
            ray_node.Node = base  # type: ignore[misc]
    _reap_agents_after(ray)


# Reads "pid start_ticks" lines until EOF, then SIGKILLs each of those processes that still runs. Run as
# `python -c`; it imports nothing of fedray or Ray, and ignores the terminal's Ctrl-C (its own session too).
_REAPER = r"""
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
marks = [line.split() for line in sys.stdin if line.strip()]
for pid, start in marks:
    try:
        with open("/proc/%s/stat" % pid, "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[19].decode() == start:
                os.kill(int(pid), signal.SIGKILL)
    except (OSError, ValueError, IndexError):
        pass
"""
_reaper = None  # the reaper of the private Ray this process started last: its stdin is open while we live


def _reap_agents_after(ray) -> None:
    """Make the private Ray's agents end with this process, however it ends. The GCS, the raylet and the log
    monitor are this process's children and die with it (Ray sets ``PR_SET_PDEATHSIG``). The raylet's agents
    (dashboard, runtime env) notice the raylet's death but then, in Ray 2.60, wait on the dead GCS to report
    it (minutes): a driver killed with SIGKILL left both running, spinning a little CPU and holding the
    dashboard agent's port 52365, so the next cold run's agent spent 3 s retrying that port. A tiny process
    holding a pipe from this one (:data:`_REAPER`) is told the agents' pids and start times; at EOF (this
    process ended, or started a new Ray) it SIGKILLs those still running. After a normal shutdown they are
    gone already and it just exits."""
    import subprocess

    from fedray.core.procinfo import proc_children, proc_start_ticks

    global _reaper
    if _reaper is not None:  # the previous private Ray of this process was shut down: let its reaper finish
        with contextlib.suppress(OSError):
            _reaper.stdin.close()
        _reaper = None
    from ray._private.ray_constants import PROCESS_TYPE_RAYLET

    node = getattr(ray._private.worker, "_global_node", None)
    try:
        raylet = node.all_processes[PROCESS_TYPE_RAYLET][0].process.pid  # type: ignore[union-attr]  # None: caught
    except (AttributeError, KeyError, IndexError, TypeError):
        return
    marks = [(pid, proc_start_ticks(pid)) for pid in proc_children(raylet)]
    lines = "".join(f"{pid} {start}\n" for pid, start in marks if start is not None)
    if not lines:
        return
    _reaper = subprocess.Popen([sys.executable, "-c", _REAPER], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True, text=True)
    assert _reaper.stdin is not None  # stdin=PIPE
    _reaper.stdin.write(lines)
    _reaper.stdin.flush()


_LEAN_HEADS: dict = {}


def _await_raylet(node, timeout_s: float = 30.0, poll_s: float = 0.02) -> None:
    """Return once the GCS lists ``node``'s raylet as alive, polling every ``poll_s``. ``Node.__init__`` then
    asks the GCS for the node through a call that, in Ray 2.60, retries once a second: the raylet registers
    1-2 s after it starts, so the driver slept up to a second (half of one on average) with both cores idle.
    Any trouble here (another Ray, a GCS that does not answer) leaves the wait to Ray's own loop."""
    try:
        client = node.get_gcs_client()
        want = node.node_id
    except Exception:  # noqa: BLE001 - Ray's own wait follows
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            nodes = client.get_all_node_info(timeout=1)
        except Exception:  # noqa: BLE001 - Ray's own wait follows
            return
        if any(nid.hex() == want and info.state == 0 for nid, info in nodes.items()):  # 0: GcsNodeInfo.ALIVE
            return
        time.sleep(poll_s)


def _lean_head_class(base):
    """The subclass of Ray's ``Node`` that :func:`_init_lean_head` starts; None when ``base`` lacks the hooks
    it relies on (another Ray version)."""
    import inspect

    from ray._private.parameter import RayParams

    if not callable(getattr(base, "start_api_server", None)) or \
            "no_monitor" not in inspect.signature(RayParams).parameters:
        return None
    if base not in _LEAN_HEADS:
        class LeanHead(base):
            def __init__(self, ray_params, *args, **kw):
                ray_params.no_monitor = True  # read by the head's start only
                super().__init__(ray_params, *args, **kw)

            def start_api_server(self, **kw):
                return None

            def start_ray_processes(self):
                super().start_ray_processes()
                _await_raylet(self)

        _LEAN_HEADS[base] = LeanHead
    return _LEAN_HEADS[base]


def _connect(ray, address: str, log_to_driver: bool, init_kwargs: dict) -> None:
    kwargs = {k: v for k, v in init_kwargs.items() if k in _CONNECT_KWARGS}
    if address.startswith(("http://", "https://")):
        raise RayConnectError(f"Ray address {address} is a dashboard / job API address (for `ray job submit`); "
                              f"fedray joins a cluster by its GCS address, HOST:PORT (e.g. 127.0.0.1:6379)")
    if address.startswith("ray://") or address == "auto":  # Ray Client, or explicitly "the recorded cluster"
        ray.init(address=address, log_to_driver=log_to_driver, **kwargs)
        return
    host, port = _split_address(address)
    if _is_loopback(host):
        _pin_loopback()
    _check_reachable(address, host, port)
    try:
        ray.init(address=f"{host}:{port}" if ":" not in host else f"[{host}]:{port}",
                 log_to_driver=log_to_driver, **kwargs)
    except ray.exceptions.AuthenticationError as e:
        raise RayConnectError(f"cannot join the Ray cluster at {address}: {e}") from None
