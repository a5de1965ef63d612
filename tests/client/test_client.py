"""The client's verbs over the mock transport: sequence numbers, versions, futures, registry."""

from __future__ import annotations

import asyncio
import threading

import pytest

import plexrl
from plexrl.client import register_transport
from plexrl.client.mock import MockTransport
from plexrl.errors import AuthError, ConfigError
from plexrl.protocol import Function, ModelSpec, Role

SPEC = ModelSpec("tiny", total_params=10, active_params=10, num_layers=1, kv_heads=1, head_dim=4,
                 source="tiny-qwen2")


def _job(staleness=0, handler=None):
    runtime = plexrl.connect("mock", handler=handler or (lambda request: request))
    return runtime, runtime.register_job("a", {"policy": SPEC}, staleness=staleness)


def test_calls_from_many_threads_get_one_contiguous_order():
    runtime, job = _job()
    threads = [threading.Thread(target=lambda: [job.logprobs({"input_ids": [[1, 2]]})
                                                for _ in range(50)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r.seq for r in runtime.transport.requests) == list(range(200))


def test_generate_samples_the_version_its_staleness_allows():
    for staleness, want in ((0, [0, 1, 2, 3]), (1, [0, 0, 1, 2])):
        _, job = _job(staleness)
        got = [job.generate([[1]], step=k, max_tokens=2).result().version for k in range(4)]
        assert got == want


def test_sync_installs_the_version_of_the_optim_steps_issued_before_it():
    _, job = _job()
    assert job.sync_weights().result().version == 0
    job.optim_step(lr=1e-3)
    job.optim_step(lr=1e-3)
    assert job.sync_weights().result().version == 2


def test_requests_carry_sizes_and_options_not_just_the_payload():
    _, job = _job()
    request = job.generate([[1, 2, 3], [4]], step=0, max_tokens=5, temperature=0.5).result()
    assert (request.function, request.num_sequences, request.seq_len, request.max_tokens) == \
        (Function.GENERATE, 2, 3, 5)
    assert request.option("temperature") == 0.5 and request.payload == {"prompts": [[1, 2, 3], [4]]}
    request = job.forward_backward({"input_ids": [[1, 2], [3, 4]]}, loss="grpo",
                                   clip_low=0.2).result()
    assert (request.num_sequences, request.seq_len, request.option("loss")) == (2, 2, "grpo")


def test_async_twins_take_their_sequence_number_when_issued():
    runtime, job = _job()

    async def main():
        second = job.logprobs_async({"input_ids": [[1]]})
        first = job.generate_async([[1]], step=0, max_tokens=1)
        return await asyncio.gather(first, second)
    first, second = asyncio.run(main())
    assert (first.seq, second.seq) == (1, 0)


def test_a_wrong_token_is_refused_by_the_transport():
    runtime, job = _job()
    job.ticket = type(job.ticket)(job.job, "not-the-token")
    with pytest.raises(AuthError):
        job.generate([[1]], step=0, max_tokens=1).result()


def test_bad_addresses_and_settings_are_named_errors():
    with pytest.raises(ConfigError, match="no transport"):
        plexrl.connect("nosuch://host:1")
    runtime = plexrl.connect("mock")
    with pytest.raises(ConfigError, match="staleness"):
        runtime.register_job("a", {"policy": SPEC}, staleness=2)


def test_a_transport_registered_by_scheme_is_found():
    made = []
    register_transport("test", lambda address, **kw: made.append(address) or MockTransport())
    runtime = plexrl.connect("test://somewhere")
    assert made == ["somewhere"] and isinstance(runtime.transport, MockTransport)
    assert runtime.register_job("b", {Role.POLICY: SPEC}).job == "b"
