"""Durable control state: the journal, and faults the runtime survives (docs/design-durable.md).

- a controller killed at a seeded random point of a 10-step job is restarted by Ray and picks
  up from its journal and its services: the job's final state is bitwise that of an
  uninterrupted run, and no call ran twice;
- a dead service ends its jobs with ``ServiceLost`` naming their last checkpoint, and a job
  resumes from it, bitwise where the uninterrupted run is;
- after the whole runtime is gone (no clean shutdown), a new one on the same state directory
  lists the job as resumable from its last checkpoint, and the job resumes from it.
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections import Counter

import numpy as np
import pytest
import ray
from safetensors.torch import load_file

import grpo_like
from plexrl.errors import ServiceLost
from plexrl.runtime.models import model_spec

SPEC = model_spec("policy", source="tiny-qwen2")
STEPS = 10
SEED = 3


def _until(condition, timeout_s=120.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("condition not reached")


def _read(journal_path, sql):
    db = sqlite3.connect(f"file:{journal_path}?mode=ro", uri=True)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def _saved(job, path):
    job.save(str(path)).result()
    return load_file(str(path))


def _same_state(a, b):
    return {key: np.array_equal(a[key].numpy(), b[key].numpy())
            for key in ("weights", "optimizer", "grads", "generator")}


@pytest.fixture
def uninterrupted(connect, tmp_path):
    """The job run alone, without faults: its per-step records and final saved state."""
    runtime = connect()
    job = runtime.register_job("j", {"policy": SPEC}, seed=SEED)
    steps = [grpo_like.step(job, k) for k in range(STEPS)]
    return steps, _saved(job, tmp_path / "uninterrupted.safetensors")


@pytest.mark.parametrize("seed", [8])
def test_a_killed_controller_restarts_and_the_job_ends_bitwise_as_if_uninterrupted(
        connect, tmp_path, uninterrupted, seed):
    reference_steps, reference = uninterrupted
    runtime = connect(state_dir=str(tmp_path / "state"))
    journal = runtime.transport.info["journal"]
    job = runtime.register_job("j", {"policy": SPEC}, seed=SEED)
    chooser = random.Random(seed)
    kill_after = chooser.randrange(1, 5 * STEPS - 1)          # calls finished before the kill
    steps, errors = [], []

    def drive():
        try:
            steps.extend(grpo_like.step(job, k) for k in range(STEPS))
        except Exception as err:   # reported below
            errors.append(err)
    driver = threading.Thread(target=drive)
    driver.start()
    _until(lambda: _read(journal, "SELECT COUNT(*) FROM outcomes")[0][0] >= kill_after)
    time.sleep(chooser.uniform(0.0, 0.2))
    ray.kill(runtime.transport.controller, no_restart=False)  # Ray restarts it
    driver.join(timeout=300)
    assert not driver.is_alive() and not errors, errors
    info = ray.get(runtime.transport.controller.info.remote())
    print(f"killed after {kill_after} calls; the restart found {info['recovered']}")
    assert info["recovered"] is not None and info["recovered"]["jobs"] == ["j"]
    final = _saved(job, tmp_path / "after-restart.safetensors")
    assert all(_same_state(reference, final).values()), _same_state(reference, final)
    for k, (solo, both) in enumerate(zip(reference_steps, steps)):
        assert np.array_equal(solo["tokens"], both["tokens"]), f"step {k}"
    # no call ran twice; every call has exactly one terminal record
    executions = runtime.inspect("executions")["wg0"]
    assert executions["repeated"] == [] and executions["total"] == 5 * STEPS + 1
    outcomes = Counter(_read(journal, "SELECT job, seq FROM outcomes"))
    calls = _read(journal, "SELECT job, seq, status FROM calls")
    assert len(calls) == 5 * STEPS + 1 and set(outcomes.values()) == {1}
    assert {(j, s) for j, s, _ in calls} == set(outcomes)
    assert {status for *_, status in calls} == {"done"}
