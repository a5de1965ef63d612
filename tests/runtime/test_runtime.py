"""The runtime on Ray end to end: calls through client, controller and service, their order,
weight versions, and bad input that fails alone."""

from __future__ import annotations

import asyncio
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from urllib.parse import unquote

import numpy as np
import pytest
import ray

import grpo_like
from plexrl.client import Runtime
from plexrl.errors import AuthError, CallError, ConfigError, PlacementError, ServiceLost
from plexrl.protocol import CallRequest, Function, Role
from plexrl.runtime.config import RuntimeConfig
from plexrl.runtime.models import model_spec
from plexrl.runtime.transport import RayTransport

SPEC = model_spec("policy", source="tiny-qwen2")


@pytest.fixture(scope="module")
def runtime(ray_session):
    """One runtime for this module's tests (each test uses its own job names)."""
    runtime = Runtime(RayTransport(config=RuntimeConfig(check_invariants=True)))
    yield runtime
    runtime.close()


def _calls(runtime, job):
    return [c for c in runtime.inspect("calls") if c["job"] == job]


def test_generate_logprobs_agree_with_logprobs_and_the_on_policy_ratio_is_one(runtime):
    job = runtime.register_job("agree", {"policy": SPEC}, seed=3)
    grpo_like.step(job, 0)                       # weights move off their initial values
    prompts = [p for p in grpo_like.PROMPTS for _ in range(grpo_like.GROUP)]
    gen = job.generate(prompts, step=1, max_tokens=6, temperature=0.7).result()
    batch = grpo_like.batch_of(prompts, gen)
    scored = job.logprobs(batch, temperature=0.7).result()["logprobs"]
    old = np.zeros_like(scored)
    for i, p in enumerate(prompts):
        n = gen["lengths"][i]
        old[i, len(p):len(p) + n] = gen["logprobs"][i, :n]
        assert np.abs(scored[i, len(p):len(p) + n] - gen["logprobs"][i, :n]).max() < 1e-5
    out = job.forward_backward({**batch, "old_logprobs": old,
                                "advantages": np.ones(len(prompts), np.float32)},
                               loss="grpo", temperature=0.7).result()
    assert abs(out["ratio_mean"] - 1.0) < 1e-5 and out["clip_frac"] == 0.0
    job.end()


def test_calls_sent_out_of_order_from_threads_run_in_sequence_order(runtime):
    job = runtime.register_job("threads", {"policy": SPEC}, seed=4)
    ids = {"input_ids": np.array([[1, 5, 9, 4]])}
    requests = []
    for seq in range(24):   # LOGPROBS and OPTIM_STEP alternate: the order changes the results
        function = Function.LOGPROBS if seq % 2 == 0 else Function.OPTIM_STEP
        options = (("temperature", 1.0),) if seq % 2 == 0 else (("lr", 1e-2),)
        requests.append(CallRequest(job.job, job.ticket.token, seq, function, Role.POLICY,
                                    options=options, num_sequences=1, seq_len=4,
                                    payload=ids if seq % 2 == 0 else None))
    random.Random(0).shuffle(requests)
    gate = threading.Barrier(4)

    def send(chunk):
        gate.wait()
        return [(r.seq, runtime.transport.submit(r)) for r in chunk]
    with ThreadPoolExecutor(4) as pool:
        sent = [x for part in pool.map(send, [requests[i::4] for i in range(4)]) for x in part]
    for _, future in sent:
        future.result()
    ran = sorted(_calls(runtime, "threads"), key=lambda c: c["start_s"])
    assert [c["seq"] for c in ran] == list(range(24))


def test_calls_sent_out_of_order_from_an_async_client_run_in_sequence_order(runtime):
    job = runtime.register_job("async", {"policy": SPEC}, seed=5)
    requests = [CallRequest(job.job, job.ticket.token, seq, Function.GENERATE, Role.POLICY,
                            max_tokens=2, num_sequences=1, seq_len=2,
                            payload={"prompts": [[1, 2]]}) for seq in range(12)]
    delays = random.Random(1).sample(range(12), 12)

    async def send(request, delay):
        await asyncio.sleep(delay / 200)
        return await asyncio.wrap_future(runtime.transport.submit(request))

    async def main():
        return await asyncio.gather(*(send(r, d) for r, d in zip(requests, delays)))
    asyncio.run(main())
    ran = sorted(_calls(runtime, "async"), key=lambda c: c["start_s"])
    assert [c["seq"] for c in ran] == list(range(12))
    assert sorted(range(12), key=lambda s: delays[s]) != list(range(12))  # they arrived shuffled


def test_generate_waits_for_the_version_its_step_names(runtime):
    on_policy = runtime.register_job("wait", {"policy": SPEC}, seed=6)
    early = on_policy.generate([[1, 2]], step=1, max_tokens=2)   # needs version 1: not yet made
    on_policy.optim_step(lr=1e-2).result()
    synced = on_policy.sync_weights()
    assert early.result()["version"] == 1 and synced.result()["version"] == 1
    calls = {c["function"]: c for c in _calls(runtime, "wait")}
    assert calls["generate"]["start_s"] >= calls["sync_weights"]["end_s"]

    stale = runtime.register_job("stale", {"policy": SPEC}, seed=6, staleness=1)
    assert stale.generate([[1, 2]], step=1, max_tokens=2).result()["version"] == 0
    stale.optim_step(lr=1e-2)
    stale.optim_step(lr=1e-2)
    stale.sync_weights().result()                                  # installs version 2
    with pytest.raises(CallError, match="version 1"):              # step 2 wanted version 1
        stale.generate([[1, 2]], step=2, max_tokens=2).result()
    assert stale.generate([[1, 2]], step=3, max_tokens=2).result()["version"] == 2


def test_a_malformed_call_is_a_named_error_and_the_job_goes_on(runtime):
    job = runtime.register_job("malformed", {"policy": SPEC}, seed=7)
    with pytest.raises(CallError, match="at least one prompt"):
        job.generate([], step=0, max_tokens=2).result()
    with pytest.raises(CallError, match="no reference model"):
        job.logprobs({"input_ids": [[1, 2]]}, role=Role.REFERENCE).result()
    with pytest.raises(CallError, match="IndexError"):               # a token outside the vocabulary
        job.logprobs({"input_ids": np.array([[1, 500]])}).result()
    with pytest.raises(ConfigError, match="advantages"):             # the loss names what is missing
        job.forward_backward({"input_ids": np.array([[1, 2, 3]]),
                              "loss_mask": np.ones((1, 3), np.float32),
                              "old_logprobs": np.zeros((1, 3), np.float32)}, loss="grpo").result()
    with pytest.raises(ConfigError, match="unknown loss|known"):
        job.forward_backward({"input_ids": np.array([[1, 2]])}, loss="nosuch").result()
    assert job.logprobs({"input_ids": np.array([[1, 2, 3]])}).result()["logprobs"].shape == (1, 3)
    assert grpo_like.step(job, 0)["tokens"].shape == (4, grpo_like.MAX_TOKENS)


def test_a_model_that_fits_no_worker_group_is_refused_with_its_sizes(connect):
    runtime = connect(device_bytes=1 << 20)
    with pytest.raises(PlacementError) as err:
        runtime.register_job("big", {"policy": SPEC})
    need = 4 * int(SPEC.total_params) * 2 + 8 * int(SPEC.total_params) + 4   # weights, grads, optimizer
    assert f"needs 1.26 MiB ({need} bytes)" in str(err.value)
    assert "has 1.00 MiB (1048576 bytes)" in str(err.value) and "Fix:" in str(err.value)


def test_unknown_and_foreign_tokens_are_refused_by_the_service(runtime):
    mine = runtime.register_job("mine", {"policy": SPEC}, seed=8)
    other = runtime.register_job("other", {"policy": SPEC}, seed=9)
    service = runtime.transport.service("wg0")
    request = CallRequest(mine.job, other.ticket.token, 0, Function.LOGPROBS, Role.POLICY,
                          num_sequences=1, seq_len=2)
    for bad in (request, replace(request, job="nobody")):
        result = service.run.remote(bad, {"input_ids": [[1, 2]]})
        with pytest.raises(AuthError):
            try:
                ray.get(result)
            except ray.exceptions.RayTaskError as err:
                raise err.cause
    forged = type(mine)(runtime.transport, replace(mine.ticket, token=other.ticket.token),
                        mine.request)
    with pytest.raises(AuthError):
        forged.logprobs({"input_ids": [[1, 2]]}).result()
    assert mine.logprobs({"input_ids": np.array([[1, 2]])}).result()["logprobs"].shape == (1, 2)
    mine.end()
    with pytest.raises(AuthError):
        mine.logprobs({"input_ids": np.array([[1, 2]])}).result()
    assert other.logprobs({"input_ids": np.array([[1, 2]])}).result()["logprobs"].shape == (1, 2)


def test_save_then_load_restores_weights_optimizer_and_sampling(runtime, tmp_path):
    job = runtime.register_job("saved", {"policy": SPEC}, seed=10)
    grpo_like.step(job, 0)
    path = str(tmp_path / "saved.safetensors")
    assert job.save(path).result()["optim_steps"] == 1
    after_save = grpo_like.step(job, 1)              # moves weights, optimizer and generator on
    job.load(path).result()                          # a new trainer version: 3
    assert job.sync_weights().result()["version"] == 3
    again = grpo_like.step(job, 3)
    assert np.array_equal(after_save["tokens"], again["tokens"])
    assert np.array_equal(after_save["old_logprobs"], again["old_logprobs"])
    with pytest.raises(CallError, match="cannot load"):
        job.load(str(tmp_path / "missing.safetensors")).result()


def test_a_value_model_scores_and_trains_beside_the_policy(runtime):
    value = model_spec("value", source="tiny-qwen2", head="value")
    job = runtime.register_job("critic", {"policy": SPEC, "value": value}, seed=11)
    ids = np.array([[1, 5, 9, 4], [1, 7, 3, 0]])
    mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0]])
    before = job.logprobs({"input_ids": ids, "attention_mask": mask}, role=Role.VALUE).result()
    assert before["values"].shape == (2, 4) and before["values"][1, 3] == 0
    values = before["values"]
    for _ in range(8):    # PPO's value step: clipped around the values it starts from
        batch = {"input_ids": ids, "attention_mask": mask, "loss_mask": mask.astype(np.float32),
                 "returns": np.ones((2, 4), np.float32), "old_values": values}
        job.forward_backward(batch, loss="value", role=Role.VALUE).result()
        job.optim_step(lr=1e-2, role=Role.VALUE).result()
        values = job.logprobs({"input_ids": ids, "attention_mask": mask},
                              role=Role.VALUE).result()["values"]
    error = lambda v: np.abs(v - 1)[mask == 1].mean()   # noqa: E731
    assert error(values) < 0.5 * error(before["values"])
    with pytest.raises(CallError, match="no rollout copy"):
        job.generate([[1, 2]], step=0, max_tokens=2, role=Role.VALUE).result()


def test_a_dead_service_fails_only_its_jobs_and_leaves_their_host_copies(connect):
    runtime = connect(groups=(("wg0", 1), ("wg1", 1)))
    jobs = {name: runtime.register_job(name, {"policy": SPEC}, seed=12) for name in ("x", "y")}
    status = runtime.inspect("status")
    group_of = {job: next(iter(set(groups.values()))) for job, groups in status["jobs"].items()}
    assert set(group_of.values()) == {"wg0", "wg1"}                # spread: one job per group
    victim = next(job for job, wg in group_of.items() if wg == "wg0")
    survivor = next(job for job in jobs if job != victim)
    host_dir = runtime.transport.host_dir("wg0")
    ray.kill(runtime.transport.service("wg0"))
    with pytest.raises(ServiceLost):
        grpo_like.step(jobs[victim], 0)
    assert grpo_like.step(jobs[survivor], 0)["tokens"].shape == (4, grpo_like.MAX_TOKENS)
    left = {unquote(p.name) for p in (host_dir / "named").iterdir()}
    assert any(name.startswith(f"{victim}/") for name in left), left   # HOST copies outlived it
