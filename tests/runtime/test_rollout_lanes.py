"""Rollout lanes on the runtime (docs/design.md, D206): a job's GENERATE split by rows over
rollout worker groups that other jobs' lanes share, bitwise as one rollout copy samples.

Setup: one training group (``purpose="train"``) and two rollout groups; each job's policy
has two rollout lanes, so every GENERATE is two calls, one on each rollout group, and every
SYNC_WEIGHTS two, each pulling the trainer's weights from the training group. "Alone" is
the same job, lanes and groups with no other job registered.
"""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.torch import load_file

import grpo_like
from plexrl.client import Runtime
from plexrl.client.mock import MockTransport
from plexrl.errors import CallError, ConfigError
from plexrl.protocol import CallRequest, Function, JobId, JobRequest, Role, shares
from plexrl.runtime.control.jobs import JobRecord, check_request, job_spec
from plexrl.runtime.models import model_spec

SPEC = model_spec("policy", source="tiny-qwen2")
SHARED = (("train", 1, "train"), ("r0", 1, "rollout"), ("r1", 1, "rollout"))
SEEDS = {"a": 1, "b": 2, "c": 3}
STEPS = 2


def _steps(runtime, names, lanes: int, tmp_path, tag: str, together: bool = True,
           split: str = "rows"):
    """Each job's step records and its saved trainer state: the jobs' steps interleaved
    (``together``), or each job registered, run and ended before the next."""
    records, saved = {}, {}
    batches = [list(names)] if together else [[n] for n in names]
    for batch in batches:
        jobs = {n: runtime.register_job(n, {"policy": SPEC}, seed=SEEDS[n],
                                        rollout_lanes=lanes, rollout_split=split)
                for n in batch}
        for k in range(STEPS):
            for n, job in jobs.items():
                records.setdefault(n, []).append(grpo_like.step(job, k))
        for n, job in jobs.items():
            path = tmp_path / f"{tag}-{n}.safetensors"
            job.save(str(path)).result()
            saved[n] = load_file(str(path))
            job.end()
    return records, saved


def _weights_equal(got: dict, want: dict) -> bool:
    return set(got) == set(want) and all(np.array_equal(got[k].numpy(), want[k].numpy())
                                         for k in want)


def test_three_jobs_over_two_shared_rollout_groups_sample_and_train_bitwise_as_alone(
        connect, tmp_path):
    runtime = connect(groups=SHARED)
    records, saved = _steps(runtime, "abc", 2, tmp_path, "shared")
    calls = runtime.inspect("calls")
    alone, alone_saved = _steps(runtime, "abc", 2, tmp_path, "alone", together=False)
    for n in "abc":   # sharing the groups changed nothing of any job
        for got, want in zip(records[n], alone[n], strict=True):
            for key in ("tokens", "gen_logprobs", "old_logprobs"):
                np.testing.assert_array_equal(got[key], want[key], err_msg=f"job {n} {key}")
        assert _weights_equal(saved[n], alone_saved[n]), n
    where = {}
    for c in calls:
        where.setdefault((c["job"], c["function"]), set()).add(c["wg"])
    for n in "abc":   # each GENERATE ran on both rollout groups, training on its own group
        assert where[(n, "generate")] == {"r0", "r1"}
        assert where[(n, "sync_weights")] == {"r0", "r1"}
        assert where[(n, "forward_backward")] == {"train"}


@pytest.mark.parametrize("split", ["rows", "calls"])
def test_two_lanes_sample_the_tokens_and_train_the_weights_of_one_rollout_copy(
        connect, tmp_path, split):
    """Over lanes the tokens, and so the trained weights, are bitwise one copy's; split by
    rows, a sampled token's logprob may differ in its last bit (a 2-row forward rounds
    unlike a 4-row one)."""
    laned, laned_saved = _steps(connect(groups=SHARED), "a", 2, tmp_path, "laned", split=split)
    one, one_saved = _steps(connect(), "a", 1, tmp_path, "one")
    for got, want in zip(laned["a"], one["a"], strict=True):
        np.testing.assert_array_equal(got["tokens"], want["tokens"])
        np.testing.assert_array_equal(got["old_logprobs"], want["old_logprobs"])
        if split == "calls":   # one lane samples the whole batch: the same forward, bitwise
            np.testing.assert_array_equal(got["gen_logprobs"], want["gen_logprobs"])
        else:
            np.testing.assert_allclose(got["gen_logprobs"], want["gen_logprobs"], rtol=0,
                                       atol=1e-5)
    trainer = ("weights", "grads", "optimizer")   # the sampling streams live with the lanes
    assert _weights_equal({k: laned_saved["a"][k] for k in trainer},
                          {k: one_saved["a"][k] for k in trainer})


def test_a_generate_is_one_call_per_lane_with_its_rows_joined_in_row_order():
    seen = []

    def handler(request: CallRequest):
        seen.append(request)
        if request.function == Function.SYNC_WEIGHTS:
            return {"version": request.version}
        start, stop = request.option("rows")
        rows = np.arange(start, stop)
        return {"tokens": rows[:, None] * np.ones((1, 3), np.int64), "lengths": rows,
                "version": 0}
    runtime = Runtime(MockTransport(handler=handler))
    job = runtime.register_job("j", {"policy": SPEC}, rollout_lanes=3)
    out = job.generate([[1]] * 5, step=0, max_tokens=3).result()
    assert [r.option("rows") for r in seen] == [(0, 2), (2, 4), (4, 5)]
    assert [r.lane for r in seen] == [0, 1, 2]
    assert [r.seq for r in seen] == [0, 1, 2]
    assert all(r.payload == {"prompts": [[1]] * 5} for r in seen)   # every lane: all prompts
    np.testing.assert_array_equal(out["lengths"], np.arange(5))
    np.testing.assert_array_equal(out["tokens"][:, 0], np.arange(5))
    assert job.sync_weights().result() == {"version": 0}
    assert [(r.function, r.lane) for r in seen[3:]] == [(Function.SYNC_WEIGHTS, lane)
                                                         for lane in range(3)]
    assert shares(2, 3) == [(0, 1), (1, 2), (2, 2)]   # more lanes than rows: empty lanes


def test_split_by_calls_sends_each_generate_whole_to_one_lane_in_turn_and_waits_for_it_only():
    seen, held = [], []

    def handler(request: CallRequest):
        seen.append(request)
        start, stop = request.option("rows")
        if stop == start:   # a lane that only keeps its stream in step: never answers here
            raise TimeoutError("not answered")
        return {"lengths": np.arange(start, stop), "version": 0}
    runtime = Runtime(MockTransport(handler=handler))
    job = runtime.register_job("j", {"policy": SPEC}, rollout_lanes=2, rollout_split="calls")
    for k in range(4):
        out = job.generate([[1]] * 3, step=0, max_tokens=2)
        held.append(out.result(timeout=5)["lengths"].tolist())   # the empty lane's error unseen
    sampled = [r.lane for r in seen if r.option("rows") == (0, 3)]
    assert held == [[0, 1, 2]] * 4
    assert sampled[0] != sampled[1] and sampled[:2] == sampled[2:]   # the lanes take turns
    assert [r.lane for r in seen] == [0, 1] * 4   # every lane is called, in its order
    with pytest.raises(ConfigError, match="rows or calls"):
        job_spec(JobRequest(JobId("k"), ((Role.POLICY, SPEC),), rollout_lanes=2,
                            rollout_split="sequences"), ("r0", "r1"))


@pytest.mark.parametrize("lanes, models, fix", [
    (0, {"policy": SPEC}, "whole number >= 1"),
    (4, {"policy": SPEC}, "at most 3 lanes"),
    (2, {"reference": SPEC}, "trainable policy"),
])
def test_bad_rollout_lanes_are_refused_naming_the_field(lanes, models, fix):
    request = JobRequest(JobId("j"), tuple((Role(r), s) for r, s in models.items()),
                         rollout_lanes=lanes)
    with pytest.raises(ConfigError, match=fix) as err:
        job_spec(request, ("train", "r0", "r1"))
    assert "rollout_lanes" in str(err.value)


def test_a_call_on_a_lane_the_job_does_not_have_is_a_call_error():
    request = JobRequest(JobId("j"), ((Role.POLICY, SPEC),), rollout_lanes=2)
    record = JobRecord(request, "t", placed=None)
    ok = CallRequest(JobId("j"), "t", 0, Function.GENERATE, Role.POLICY, num_sequences=1,
                     max_tokens=1, lane=1)
    check_request(ok, record)
    with pytest.raises(CallError, match="lane 2 .* does not exist"):
        check_request(CallRequest(JobId("j"), "t", 1, Function.GENERATE, Role.POLICY,
                                  num_sequences=1, max_tokens=1, lane=2), record)
    with pytest.raises(CallError, match="lane 1"):   # a trainer copy has no lanes
        check_request(CallRequest(JobId("j"), "t", 2, Function.OPTIM_STEP, Role.POLICY,
                                  lane=1), record)


def test_a_killed_controller_restarts_a_laned_job_which_ends_bitwise_as_uninterrupted(
        connect, tmp_path):
    """The journal and the services' holdings name each lane's copy (``rollout#1``): a
    controller killed mid-run rebinds both lanes, and the job ends as if uninterrupted."""
    import threading
    import time

    import ray
    steps = 4
    reference = connect(groups=SHARED)
    job = reference.register_job("j", {"policy": SPEC}, seed=3, rollout_lanes=2)
    want = [grpo_like.step(job, k) for k in range(steps)]
    want_saved = load_file(str(_save(job, tmp_path / "uninterrupted.safetensors")))
    runtime = connect(groups=SHARED, state_dir=str(tmp_path / "state"))
    job = runtime.register_job("j", {"policy": SPEC}, seed=3, rollout_lanes=2)
    got, errors = [], []

    def drive():
        try:
            got.extend(grpo_like.step(job, k) for k in range(steps))
        except Exception as err:   # reported below
            errors.append(err)
    driver = threading.Thread(target=drive)
    driver.start()
    deadline = time.monotonic() + 120
    while len(runtime.inspect("calls")) < 9 and time.monotonic() < deadline:   # into step 1
        time.sleep(0.02)
    ray.kill(runtime.transport.controller, no_restart=False)   # Ray restarts it
    driver.join(timeout=300)
    assert not driver.is_alive() and not errors, errors
    info = ray.get(runtime.transport.controller.info.remote())
    assert info["recovered"] is not None and info["recovered"]["jobs"] == ["j"]
    for k, (a, b) in enumerate(zip(want, got, strict=True)):
        np.testing.assert_array_equal(a["tokens"], b["tokens"], err_msg=f"step {k}")
    saved = load_file(str(_save(job, tmp_path / "restarted.safetensors")))
    assert _weights_equal(saved, want_saved)


def _save(job, path):
    job.save(str(path)).result()
    return path
