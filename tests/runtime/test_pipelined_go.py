"""A call sent behind another (``CallOrder.after``) runs after it on the service, whatever
order the two orders and their payloads arrive in (D180). The service actor is driven
directly in an asyncio loop, without Ray, on the simulated engine (which checks that a
job's calls on a copy run in order: ``take_turn``)."""

from __future__ import annotations

import asyncio

import pytest

from plexrl.protocol import CallRequest, Copy, Function, Role, State
from plexrl.runtime.workers.order import CallOrder
from plexrl.runtime.models import model_spec
from plexrl.runtime.workers.actor import ServiceActor


def order(seq: int, after: int | None = None) -> CallOrder:
    request = CallRequest("j", "tok", seq, Function.LOGPROBS, Role.POLICY, num_sequences=1,
                          seq_len=4)
    return CallOrder(request, seq, 0, copy_seq=seq, after=None if after is None else ("j", after))


async def serve(first_payload_late: bool) -> list[int]:
    actor = ServiceActor("wg0", 1 << 20, "/tmp", 1, engine="simulated", call_s=0.01)
    spec = model_spec("policy", source="tiny-qwen2")
    await actor.bind("j", "tok", Role.POLICY, Copy.TRAINER, spec, 0, {State.WEIGHTS: 0})
    ran: list[int] = []

    async def job_sends(seq: int, delay: float):
        await asyncio.sleep(delay)
        await actor.run(order(seq).request, None)
        ran.append(seq)
    # the go for call 1 (behind call 0) arrives first; call 0's payload comes last if late
    behind = asyncio.ensure_future(actor.go(order(1, after=0)))
    sends = [asyncio.ensure_future(job_sends(1, 0.0)),
             asyncio.ensure_future(job_sends(0, 0.05 if first_payload_late else 0.0))]
    await asyncio.sleep(0.02)
    first = asyncio.ensure_future(actor.go(order(0)))
    records = await asyncio.gather(first, behind, *sends)
    assert [r["failed"] for r in records[:2]] == ["", ""], records
    return ran


@pytest.mark.parametrize("late", [False, True], ids=["payloads-at-once", "first-payload-late"])
def test_a_call_sent_behind_another_runs_after_it(late):
    assert asyncio.run(serve(late)) == [0, 1]


def test_a_call_behind_one_of_a_job_that_is_gone_does_not_wait_for_it():
    async def main():
        actor = ServiceActor("wg0", 1 << 20, "/tmp", 1, engine="simulated", call_s=0.0)
        spec = model_spec("policy", source="tiny-qwen2")
        await actor.bind("j", "tok", Role.POLICY, Copy.TRAINER, spec, 0, {State.WEIGHTS: 0})
        stuck = asyncio.ensure_future(actor._handed("j", 0))   # call 0's go never comes
        await asyncio.sleep(0.01)
        assert not stuck.done()
        await actor.unbind("j", RuntimeError("ended"))
        await asyncio.wait_for(stuck, 1.0)
        await asyncio.wait_for(actor._handed("gone", 3), 1.0)
    asyncio.run(main())
