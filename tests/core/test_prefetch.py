"""Prefetch behind a running call keeps the States its job's next call on the copy needs.

One device of 1000 bytes, FCFS. Job a (52 params: WEIGHTS 104, GRADS 208, OPTIMIZER 624)
is resident and runs its LOGPROBS; job b (50 params) waits on HOST with an older LOGPROBS
that needs its WEIGHTS (100 bytes), 36 more than the device has free. While a's LOGPROBS
runs, FCFS picks b's call to prefetch. Room for it could only come from a's GRADS or
OPTIMIZER, which a's queued FORWARD_BACKWARD needs next: prefetch must leave them
(docs/design.md, D49.
"""

from __future__ import annotations

from plexrl.core import plan
from plexrl.core.decisions import Move
from plexrl.core.snapshot import CoreConfig
from plexrl.protocol import Function, State, Tier

from core_builders import admitted, dispatch, one_group, queue, trainer_job, with_tiers


def running_logprobs(with_next_call: bool):
    snap = admitted(one_group(), trainer_job("a", 52), trainer_job("b", 50),
                    config=CoreConfig(queue_policy="fcfs"))
    snap = with_tiers(snap, {}, job_tiers={"a": Tier.DEVICE, "b": Tier.HOST})
    snap = queue(snap, 1, "b", 0, Function.LOGPROBS, at=0.0)
    snap = queue(snap, 2, "a", 0, Function.LOGPROBS, at=0.5)
    if with_next_call:
        snap = queue(snap, 3, "a", 1, Function.FORWARD_BACKWARD, at=0.5)
    return dispatch(snap, 2, now=0.5)


def test_prefetch_does_not_evict_the_states_of_the_running_jobs_next_call():
    decisions = plan(running_logprobs(with_next_call=True), 1.0)
    evicted = [d.key for d in decisions if isinstance(d, Move) and d.key.job == "a"]
    assert evicted == [], decisions


def test_without_a_next_call_prefetch_may_evict_the_running_jobs_other_states():
    """The same world with nothing of a's queued behind its LOGPROBS: b's WEIGHTS get room
    from a's OPTIMIZER, so the prefetch does act here (the test above is not vacuous)."""
    decisions = plan(running_logprobs(with_next_call=False), 1.0)
    evicted = {d.key.state for d in decisions if isinstance(d, Move) and d.key.job == "a"}
    assert evicted == {State.OPTIMIZER}, decisions


def test_prefetch_also_makes_room_for_the_next_calls_workspace():
    """Jobs a and c resident (360 bytes each: 20 params), b on HOST; a's LOGPROBS runs with
    no workspace while b's older LOGPROBS waits with a 300-byte workspace. b's WEIGHTS (40)
    fit in the 280 bytes free, its workspace does not: prefetch first evicts an OPTIMIZER
    that a's running call does not use (a's and c's tie; the key order picks), so b's call
    need not wait for an eviction once a's call ends (docs/design.md, D178)."""
    snap = admitted(one_group(), trainer_job("a", 20), trainer_job("b", 20), trainer_job("c", 20),
                    config=CoreConfig(queue_policy="fcfs"))
    snap = with_tiers(snap, {}, job_tiers={"a": Tier.DEVICE, "b": Tier.HOST, "c": Tier.DEVICE})
    snap = queue(snap, 1, "b", 0, Function.LOGPROBS, at=0.0, workspace_bytes=300)
    snap = queue(snap, 2, "a", 0, Function.LOGPROBS, at=0.5)
    decisions = plan(dispatch(snap, 2, now=0.5), 1.0)
    moves = {(d.key.job, d.key.state, d.dst) for d in decisions if isinstance(d, Move)}
    assert moves == {("a", State.OPTIMIZER, Tier.HOST)}, decisions
