"""PlexRL as a team's service, end to end through the ``plexrl`` command.

One module-wide service: ``plexrl up`` in a subprocess starts its own Ray head on loopback
(free ports, its own temp dir, never the test session's embedded cluster) and a detached
controller whose run directory is a temp dir; ``plexrl down`` stops both in a finally.
Host memory is sized so one job whose optimizer is pinned to host (``adamw-offload``)
fits and a second waits: that is how these tests make a queue.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: one tiny-qwen2 optimizer pinned to host is 659,972 bytes: one fits, a second waits
HOST_BYTES = 1_000_000

HOLD = """
name = "{name}"
priority = {priority}
[entry]
command = ["bash", "-c", "sleep 300 & echo gc=$!; wait"]
[models.policy]
source = "tiny-qwen2"
optimizer = "adamw-offload"
"""


class Service:
    def __init__(self, home: Path):
        self.home = home
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("RAY_ADDRESS", "PLEXRL_"))}
        self.env.update(PLEXRL_HOME=str(home), PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0")

    def run(self, *args: str, token: str | None = None, ok: bool = True, timeout: float = 180):
        argv = [sys.executable, "-m", "plexrl.cli.main", *args]
        if token is not None:
            argv += ["--token", token]
        done = subprocess.run(argv, cwd=ROOT, env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        if ok:
            assert done.returncode == 0, (args, done.stdout, done.stderr[-3000:])
        return done

    def json(self, *args: str, token: str | None = None) -> dict:
        out = self.run(*args, "--format", "json", token=token).stdout
        return json.loads(out)          # exactly one JSON object on stdout

    def job_file(self, name: str, priority: int = 0) -> str:
        path = self.home / f"{name}.toml"
        path.write_text(HOLD.format(name=name, priority=priority))
        return str(path)

    def jobs(self, token: str | None = None) -> dict[str, dict]:
        return {j["job"]: j for j in self.json("jobs", token=token)["jobs"]}

    def wait_for(self, job: str, states: tuple[str, ...], timeout: float = 60,
                 every: str = "") -> dict:
        """The job's view once its state is one of ``states`` (all jobs: every="jobs")."""
        deadline = time.monotonic() + timeout
        while True:
            jobs = self.jobs()
            view = jobs.get(job, {})
            if view.get("state") in states or time.monotonic() > deadline:
                assert view.get("state") in states, (job, view)
                return jobs if every else view
            time.sleep(0.5)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    home = tmp_path_factory.mktemp("plexrl-home")
    svc = Service(home)
    try:
        svc.up = svc.json("up", "--devices", "1", "--host-bytes", str(HOST_BYTES))
        yield svc
    finally:
        state = home / "state.json"
        if state.exists():
            pid = json.loads(state.read_text()).get("head_pid")
            svc.run("down", ok=False, timeout=120)
            if pid:   # backstop: the head's process group, if down could not stop it
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def test_up_starts_a_head_writes_an_owner_only_token_and_a_second_up_reports_it(service):
    assert service.up["started_head"] and not service.up["already_running"]
    assert re.fullmatch(r"127\.0\.0\.1:\d+", service.up["address"])
    token = Path(service.up["token_file"])
    assert token.stat().st_mode & 0o777 == 0o600
    again = service.json("up")
    assert again["already_running"] and again["address"] == service.up["address"]
    status = service.json("status")
    assert status["controller"] == "plexrl-controller" and status["worker_groups"] == ["wg0"]
    assert "endpoints" in status     # None unless the controller offers some


def test_submit_runs_the_program_and_logs_its_output(service):
    sub = service.json("submit", str(ROOT / "examples" / "jobs" / "own-job.toml"))
    assert sub["job"] == "own-job" and len(sub["token"]) == 32
    logs = service.run("logs", "own-job", "--follow", timeout=240).stdout
    assert re.search(r"step  2  reward \d\.\d{3}", logs), logs
    view = service.jobs()["own-job"]          # logs --follow returns once the program exited
    assert view["state"] == "succeeded" and view["exit_code"] == 0 and view["position"] is None


def test_status_reports_the_metrics_endpoint_and_trace_attaches_to_the_service(service):
    import urllib.request
    endpoints = service.json("status")["endpoints"]
    assert endpoints["metrics"].startswith("http://127.0.0.1:")
    with urllib.request.urlopen(endpoints["metrics"], timeout=30) as answer:
        assert b"plexrl_calls_total{" in answer.read()   # own-job's calls, above
    out = service.home / "trace.json"
    assert "wrote" in service.run("trace", "--job", "own-job", "-o", str(out)).stdout
    spans = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X"]
    assert spans and {e["args"]["job"] for e in spans if "job" in e["args"]} == {"own-job"}


def test_queue_by_priority_job_tokens_and_cancel(service):
    """Queued positions follow priority (status and jobs); a job cannot list, read or cancel
    another job without the operator token; cancel kills the program's process group."""
    service.json("submit", service.job_file("holder"))          # placed at once: it fits
    low = service.json("submit", service.job_file("low", priority=0))
    high = service.json("submit", service.job_file("high", priority=3))
    jobs = service.jobs()
    assert jobs["holder"]["state"] in ("starting", "running")
    assert jobs["low"]["state"] == jobs["high"]["state"] == "queued"
    assert (jobs["high"]["position"], jobs["low"]["position"]) == (1, 2)
    assert "host memory" in jobs["low"]["reason"] and "high" in jobs["low"]["reason"]
    assert [q["job"] for q in service.json("status")["queue"]] == ["high", "low"]

    # a job's token: only its own job
    assert list(service.jobs(token=high["token"])) == ["high"]
    for args in (("logs", "low"), ("cancel", "low")):
        denied = service.run(*args, token=high["token"], ok=False)
        assert denied.returncode == 2 and "operator token" in denied.stderr, denied.stderr
    assert service.run("jobs", token="not-a-token", ok=False).returncode == 2

    holder = service.wait_for("holder", ("running",))
    grandchild = int(re.search(r"gc=(\d+)", service.json("logs", "holder")["text"]).group(1))
    cancelled = service.json("cancel", "holder")
    assert cancelled["state"] == "cancelled" and cancelled["exit_code"] is not None
    assert not _alive(holder["pid"]) and not _alive(grandchild)
    jobs = service.wait_for("high", ("starting", "running"), every="jobs")
    assert jobs["low"]["state"] == "queued" and jobs["low"]["position"] == 1   # untouched
    assert service.json("cancel", "high", token=high["token"])["state"] == "cancelled"
    assert service.json("cancel", "low")["state"] == "cancelled"   # the operator: any job


INVALID = {
    "name": 'name = "bad name"\n[entry]\ncommand = ["true"]\n[models.policy]\n'
            'source = "tiny-qwen2"',
    "models.policy.resources.device_bytes":   # valid, but larger than any device: controller
        'name = "big"\n[entry]\ncommand = ["true"]\n[models.policy]\nsource = "tiny-qwen2"\n'
        '[models.policy.resources]\ndevice_bytes = "1TiB"',
}


def test_an_invalid_job_file_exits_2_naming_it_and_submits_nothing(service):
    before = service.jobs()
    for field, text in INVALID.items():
        path = service.home / "invalid.toml"
        path.write_text(text)
        done = service.run("submit", str(path), ok=False)
        assert done.returncode == 2 and done.stdout == "", done.stderr
        assert str(path) in done.stderr and field in done.stderr and "fix:" in done.stderr
    assert service.jobs() == before


def test_down_stops_the_controller_and_the_head_it_started(service):
    state = json.loads((service.home / "state.json").read_text())
    done = service.json("down")
    assert done["stopped"] and done["stopped_head"]
    assert not (service.home / "state.json").exists()
    assert not _alive(state["head_pid"])
    assert service.run("status", ok=False).returncode == 2


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_up_splits_its_devices_into_equal_groups_and_refuses_an_uneven_split():
    from argparse import Namespace

    from plexrl.cli.service import _config
    from plexrl.errors import ConfigError
    unset = dict(device_bytes=None, host_bytes=None, lease_s=None, queue_policy=None)
    config = _config(Namespace(devices=4, groups=2, **unset))
    assert [(g.name, g.num_devices) for g in config.worker_groups] == [("wg0", 2), ("wg1", 2)]
    with pytest.raises(ConfigError, match="--devices 3 cannot be split into 2"):
        _config(Namespace(devices=3, groups=2, **unset))
