"""A job whose driver dies (mid-step, its calls in flight) is ended after its lease: its States
are released, each of its calls has one terminal record in the journal, other jobs go on."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from collections import Counter
import textwrap
import time
from pathlib import Path

import ray

import grpo_like
from test_equivalence import JOB_BYTES
from plexrl.runtime.models import model_spec

SPEC = model_spec("policy", source="tiny-qwen2")

ORPHAN = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from plexrl.client import Runtime
    from plexrl.runtime.models import model_spec
    from plexrl.runtime.transport import RayTransport
    runtime = Runtime(RayTransport({address!r}, controller={controller!r}))
    job = runtime.register_job("orphan", {{"policy": model_spec("policy", source="tiny-qwen2")}})
    job.logprobs({{"input_ids": [[1, 2, 3]]}}).result()
    for k in range(3):    # mid-step: a step's calls are in flight when the driver dies
        job.generate([[1, 2], [3]], step=0, max_tokens=4)
        job.logprobs({{"input_ids": [[1, 2, 3]]}})
    print("ready", flush=True)
    time.sleep(600)
""")


def _until(condition, timeout_s=60.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError("condition not reached")


def _held(runtime):
    return {wg: (s["device_bytes"], s["host_bytes"], s["disk_bytes"], s["disk_files"],
                 s["num_states"]) for wg, s in runtime.inspect("bytes").items()}


def _orphan_calls(journal) -> int:
    db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
    try:
        return db.execute("SELECT COUNT(*) FROM calls WHERE job = 'orphan'").fetchone()[0]
    finally:
        db.close()


def _spill_files(spill_root):
    return sorted(p.name for p in spill_root.rglob("*") if p.is_file())


def test_a_dead_driver_s_job_is_released_after_its_lease_and_others_go_on(connect, tmp_path):
    # host memory holds one job's States: the other's fill it, so the orphan's start on DISK
    runtime = connect(lease_s=1.5, host_bytes=JOB_BYTES + 4 * int(SPEC.total_params),
                      spill_root=str(tmp_path), state_dir=str(tmp_path / "state"))
    other = runtime.register_job("other", {"policy": SPEC}, seed=1)
    before, files_before = _held(runtime), _spill_files(tmp_path)
    script = ORPHAN.format(tests=str(Path(__file__).parent),
                           address=ray.get_runtime_context().gcs_address,
                           controller=runtime.transport.controller_name)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert "orphan" in runtime.inspect("status")["jobs"]
        assert _held(runtime) != before
        assert any(name.startswith("orphan") for name in _spill_files(tmp_path))
        journal = runtime.transport.info["journal"]
        _until(lambda: _orphan_calls(journal) == 7)    # all its calls reached the controller
        child.kill()                                   # the driver dies without a word
        child.wait()
        _until(lambda: "orphan" not in runtime.inspect("status")["jobs"])
        _until(lambda: _held(runtime) == before)       # every byte of it released
        assert _spill_files(tmp_path) == files_before  # and its spill files are gone
    finally:
        child.kill()
    db = sqlite3.connect(f"file:{runtime.transport.info['journal']}?mode=ro", uri=True)
    calls = db.execute("SELECT seq, status FROM calls WHERE job = 'orphan'").fetchall()
    ended = Counter(seq for (seq,) in db.execute("SELECT seq FROM outcomes WHERE job = 'orphan'"))
    db.close()
    assert len(calls) == 7 and set(ended.values()) == {1} and set(ended) == {s for s, _ in calls}
    assert {status for _, status in calls} <= {"done", "cancelled"}
    assert grpo_like.step(other, 0)["tokens"].shape == (4, grpo_like.MAX_TOKENS)


def test_a_live_driver_keeps_its_job_past_the_lease(connect):
    runtime = connect(lease_s=1.0)
    job = runtime.register_job("alive", {"policy": SPEC}, seed=2)
    time.sleep(3.0)                                    # three leases, renewed by the transport
    assert grpo_like.step(job, 0)["tokens"].shape == (4, grpo_like.MAX_TOKENS)
