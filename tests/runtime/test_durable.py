"""Durable control state: the journal, and faults the runtime survives (docs/design.md).

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


@pytest.fixture(scope="module")
def uninterrupted(ray_session, tmp_path_factory):
    """The job run alone, without faults (once for the module): its per-step records and
    final saved state."""
    from plexrl.client import Runtime
    from plexrl.runtime.config import RuntimeConfig
    from plexrl.runtime.transport import RayTransport
    with Runtime(RayTransport(config=RuntimeConfig(check_invariants=True))) as runtime:
        job = runtime.register_job("j", {"policy": SPEC}, seed=SEED)
        steps = [grpo_like.step(job, k) for k in range(STEPS)]
        return steps, _saved(job, tmp_path_factory.mktemp("alone") / "j.safetensors")


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


def test_a_dead_service_names_the_last_checkpoint_and_the_job_resumes_from_it_bitwise(
        connect, tmp_path, uninterrupted):
    reference_steps, reference = uninterrupted
    runtime = connect(groups=(("wg0", 1), ("wg1", 1)), state_dir=str(tmp_path / "state"))
    job = runtime.register_job("j", {"policy": SPEC}, seed=SEED, save_interval=2)
    other = runtime.register_job("other", {"policy": SPEC}, seed=5)
    group_of = {name: next(iter(set(groups.values())))
                for name, groups in runtime.inspect("status")["jobs"].items()}
    assert group_of["j"] != group_of["other"]                  # spread: one job per group
    for k in range(5):                                         # versions 1..5: saved at 2 and 4
        grpo_like.step(job, k)
    ray.kill(runtime.transport.service(group_of["j"]))
    with pytest.raises(ServiceLost) as lost:
        grpo_like.step(job, 5)
    assert (lost.value.job, lost.value.wg, lost.value.last_version) == ("j", group_of["j"], 4)
    assert lost.value.checkpoint.endswith("v4.safetensors")
    assert grpo_like.step(other, 0)["tokens"].shape == (4, grpo_like.MAX_TOKENS)  # unaffected
    # the job resumes from its last copy, on the group that is left
    resumed = runtime.register_job("j", {"policy": SPEC}, seed=SEED, save_interval=2)
    resumed.load(lost.value.checkpoint, version=lost.value.last_version).result()
    resumed.sync_weights(step=lost.value.last_version).result()
    steps = [grpo_like.step(resumed, k) for k in range(lost.value.last_version, STEPS)]
    for k, (solo, again) in enumerate(zip(reference_steps[4:], steps), start=4):
        assert np.array_equal(solo["tokens"], again["tokens"]), f"step {k}"
    final = _saved(resumed, tmp_path / "resumed.safetensors")
    assert all(_same_state(reference, final).values()), _same_state(reference, final)
    assert set(runtime.inspect("status")["jobs"]["j"].values()) == {group_of["other"]}


def test_after_the_whole_runtime_is_gone_a_new_one_resumes_the_job_from_its_last_checkpoint(
        connect, tmp_path, uninterrupted):
    from plexrl.client import Runtime
    from plexrl.runtime.config import RuntimeConfig
    from plexrl.runtime.transport import RayTransport
    reference_steps, reference = uninterrupted
    state = tmp_path / "state"
    first = Runtime(RayTransport(config=RuntimeConfig(state_dir=str(state))))
    job = first.register_job("j", {"policy": SPEC}, seed=SEED, save_interval=3)
    for k in range(7):                                         # versions 1..7: saved at 3 and 6
        grpo_like.step(job, k)
    # everything of the runtime dies at once, without a word: controller, services, reservation
    transport = first.transport
    transport._closed.set()
    service = transport.service("wg0")
    ray.kill(transport.controller)
    ray.kill(service)
    ray.util.remove_placement_group(ray.util.get_placement_group(
        f"plexrl-{transport.session}-groups"))
    second = connect(state_dir=str(state))                     # a new runtime, the same state
    resumable = second.inspect("resumable")
    assert set(resumable) == {"j"} and resumable["j"]["status"] == "interrupted"
    version, path = resumable["j"]["version"], resumable["j"]["path"]
    assert version == 6
    resumed = second.register_job("j", {"policy": SPEC}, seed=SEED, save_interval=3)
    resumed.load(path, version=version).result()
    resumed.sync_weights(step=version).result()
    steps = [grpo_like.step(resumed, k) for k in range(version, STEPS)]
    for k, (solo, again) in enumerate(zip(reference_steps[version:], steps), start=version):
        assert np.array_equal(solo["tokens"], again["tokens"]), f"step {k}"
    final = _saved(resumed, tmp_path / "resumed.safetensors")
    assert all(_same_state(reference, final).values()), _same_state(reference, final)
    assert second.inspect("resumable") == {}                   # registered again: not resumable
