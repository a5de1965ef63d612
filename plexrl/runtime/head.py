"""What ``plexrl up`` starts and ``plexrl down`` stops: a Ray head and a detached controller.

Owns: the run directory (``$PLEXRL_HOME``, else ``~/.plexrl``: ``state.json`` says what ``up``
started, ``operator-token`` is readable by its owner only, ``logs/`` holds job logs,
``ray-head.log`` the head's output), starting a Ray head on loopback as a ``ray start --head
--block`` child in its own session (so stopping that one process group stops exactly this
head, never another Ray cluster of the machine), creating the detached, named controller in
namespace ``plexrl``, and finding it again. Must not know: how jobs run, what the CLI prints.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from plexrl.errors import AuthError, ConfigError

CONTROLLER_NAME = "plexrl-controller"
TOKEN_FILE = "operator-token"
RAY_TOKEN_FILE = "ray-auth-token"   #: Ray's own cluster token (token authentication)
STATE_FILE = "state.json"
HEAD_READY_S = 60.0


@dataclass(frozen=True)
class HeadState:
    """What ``up`` left running, as ``state.json`` records it."""

    address: str                 #: the Ray cluster's GCS address, host:port
    controller: str              #: the detached controller's name (namespace plexrl)
    started_head: bool           #: did ``up`` start the Ray head (``down`` stops it then)
    head_pid: int = 0            #: the ``ray start --block`` process, leader of its group
    temp_dir: str = ""           #: the head's Ray temp directory (removed by ``down``)


def run_dir() -> Path:
    return Path(os.environ.get("PLEXRL_HOME") or Path.home() / ".plexrl").expanduser()


def read_state() -> HeadState | None:
    path = run_dir() / STATE_FILE
    if not path.exists():
        return None
    return HeadState(**json.loads(path.read_text()))


def write_state(state: HeadState) -> None:
    path = run_dir() / STATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(state), indent=1))


def clear_state() -> None:
    for name in (STATE_FILE, TOKEN_FILE, RAY_TOKEN_FILE):
        (run_dir() / name).unlink(missing_ok=True)


def write_token(name: str = TOKEN_FILE) -> str:
    """A fresh token in a file of the run directory only its owner can read (0600, created
    so): the operator token, or Ray's cluster token."""
    path = run_dir() / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(token + "\n")
    return token


def read_token(explicit: str | None = None) -> str:
    """The token a command acts with: ``--token``, else ``$PLEXRL_TOKEN``, else the
    operator token file of the run directory."""
    token = explicit or os.environ.get("PLEXRL_TOKEN")
    if token:
        return token
    path = run_dir() / TOKEN_FILE
    try:
        return path.read_text().strip()
    except OSError:
        raise AuthError(f"no token: pass --token, set PLEXRL_TOKEN, or run where `plexrl up` "
                        f"wrote {path}") from None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_head(num_devices: int, num_cpus: int | None = None, host: str = "127.0.0.1") -> HeadState:
    """Start a Ray head on ``host`` with ``num_devices`` emulated devices; return once its
    GCS answers. Every port is picked free, so it never meets another cluster's."""
    ray_bin = Path(sys.executable).with_name("ray")
    temp_dir = tempfile.mkdtemp(prefix="plexrl-ray-", dir="/tmp")   # short: socket paths
    port = _free_port()
    ports = {f"--{name}": str(_free_port()) for name in (
        "node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
        "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port")}
    argv = [str(ray_bin) if ray_bin.exists() else "ray", "start", "--head", "--block",
            f"--node-ip-address={host}", f"--port={port}", f"--temp-dir={temp_dir}",
            "--include-dashboard=false", "--disable-usage-stats",
            f"--num-cpus={num_cpus or os.cpu_count() or 1}",
            "--resources=" + json.dumps({"plexrl_device": num_devices})]
    argv += [a for kv in ports.items() for a in kv]
    write_token(RAY_TOKEN_FILE)
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", **ray_auth_env())
    for key in ("RAY_ADDRESS", "RAY_JOB_ID", "RAY_RAYLET_PID", "RAY_NODE_ID"):
        env.pop(key, None)
    log = open(run_dir() / "ray-head.log", "ab")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, start_new_session=True)
    log.close()
    state = HeadState(address=f"{host}:{port}", controller=CONTROLLER_NAME, started_head=True,
                      head_pid=proc.pid, temp_dir=temp_dir)
    deadline = time.monotonic() + HEAD_READY_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            shutil.rmtree(temp_dir, ignore_errors=True)
            raise ConfigError(f"the Ray head exited at start (status {proc.returncode}); see "
                              f"{run_dir() / 'ray-head.log'}", field="address",
                              fix="check the log; pass --address to join a running cluster")
        if _gcs_answers(host, port) and _session_ready(temp_dir):
            return state
        time.sleep(0.2)
    stop_head(state)
    raise ConfigError(f"the Ray head did not answer within {HEAD_READY_S:.0f} s", field="address",
                      fix=f"see {run_dir() / 'ray-head.log'}")


def _gcs_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def _session_ready(temp_dir: str) -> bool:
    """The raylet has written its session (``ray start`` prints its banner after that)."""
    return (Path(temp_dir) / "session_latest").exists()


def stop_head(state: HeadState, grace_s: float = 5.0) -> None:
    """Stop the head ``up`` started: SIGTERM to its ``ray start --block`` process group,
    then, after ``grace_s``, SIGKILL to every process of its session (the Ray processes it
    started; a submitted job's program runs in a session of its own and was ended before);
    remove its temp directory."""
    if not state.started_head or not state.head_pid:
        return
    try:
        os.killpg(state.head_pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _alive(state.head_pid):
        time.sleep(0.1)
    for pid in _session_members(state.head_pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if state.temp_dir and Path(state.temp_dir).name.startswith("plexrl-ray-"):
        shutil.rmtree(state.temp_dir, ignore_errors=True)


def _session_members(sid: int) -> list[int]:
    """The live processes whose session id is ``sid``."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


def _alive(pid: int) -> bool:
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)   # our child when up and down share a process
        if done:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return _state_of(pid) != "Z"


def _state_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def ray_auth_env() -> dict[str, str]:
    """The environment that makes Ray use the run directory's cluster token, when ``up``
    started the head (a joined cluster keeps its own authentication)."""
    path = run_dir() / RAY_TOKEN_FILE
    if not path.exists():
        return {}
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}


def connect_ray(address: str) -> None:
    """This process as a Ray driver of the cluster at ``address``, in namespace plexrl."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.update(ray_auth_env())    # read when ray is imported
    import ray
    if not ray.is_initialized():
        ray.init(address=address, namespace="plexrl", logging_level="ERROR",
                 log_to_driver=False)


def find_controller(name: str = CONTROLLER_NAME):
    """The named controller's handle, or None."""
    import ray
    try:
        return ray.get_actor(name, namespace="plexrl")
    except ValueError:
        return None


def create_controller(config, name: str = CONTROLLER_NAME, timeout_s: float = 120.0):
    """Create the detached controller on this driver's node and wait until it answers."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from plexrl.runtime.control.controller import Controller
    handle = ray.remote(Controller).options(
        name=name, namespace="plexrl", lifetime="detached", num_cpus=0, max_concurrency=1000,
        scheduling_strategy=NodeAffinitySchedulingStrategy(
            ray.get_runtime_context().get_node_id(), soft=False),
    ).remote(config, secrets.token_hex(4))
    ray.get(handle.start.remote(), timeout=timeout_s)
    return handle


def call(method, *args, timeout_s: float = 120.0):
    """``ray.get`` of an actor method's call, raising the runtime's own error rather than
    Ray's wrapper of it."""
    import ray
    try:
        return ray.get(method.remote(*args), timeout=timeout_s)
    except ray.exceptions.RayTaskError as err:
        raise (err.cause if err.cause is not None else err) from None


def kill(handle) -> None:
    """End an actor now (the controller, after its ``stop_service``)."""
    import ray
    ray.kill(handle)
