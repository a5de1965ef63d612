"""Pipelined dispatch: the next call goes to a group behind its running call (D180).

One device of 1000 bytes, FCFS. Jobs a and b (20 params: 360 bytes of States each) are both
resident; a's LOGPROBS runs. With ``pipeline`` the planner sends b's queued call behind it,
once it could start as a's call ends (States resident, workspace fits then); the ledger starts
it at the running call's end, or when that call's job ends.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from plexrl.core import apply, assume, plan
from plexrl.core import events as ev
from plexrl.core.decisions import Dispatch, Move
from plexrl.core.invariants import check_decisions, check_snapshot
from plexrl.core.snapshot import CoreConfig
from plexrl.protocol import Function, State, Tier

from core_builders import (admitted, dispatch, key, one_group, queue, rl_job, trainer_job,
                           with_tiers)

PIPELINE = CoreConfig(queue_policy="fcfs", pipeline=True)


def running_a(config: CoreConfig = PIPELINE, b_tier: Tier = Tier.DEVICE, b_workspace: int = 0):
    """a's LOGPROBS (call 1, 100-byte workspace) runs since t=0; b's (call 2) is queued."""
    snap = admitted(one_group(), trainer_job("a", 20), trainer_job("b", 20), config=config)
    snap = with_tiers(snap, {}, job_tiers={"a": Tier.DEVICE, "b": b_tier})
    snap = queue(snap, 1, "a", 0, Function.LOGPROBS, at=0.0, workspace_bytes=100)
    snap = queue(snap, 2, "b", 0, Function.LOGPROBS, at=0.1, workspace_bytes=b_workspace)
    return dispatch(snap, 1, now=0.0)


def test_a_call_whose_states_are_resident_is_sent_behind_the_running_one():
    snap = running_a()
    decisions = plan(snap, 0.5)
    assert decisions == [Dispatch(call=2, wg="g0", uses=decisions[0].uses)]
    assert check_decisions(snap, decisions, 0.5) == []
    behind = assume(snap, decisions[0], 0.5)
    assert behind.running["g0"].call == 1 and behind.behind["g0"].call == 2
    assert plan(behind, 0.6) == []                 # one call behind at most: the group is quiet
    done = apply(behind, ev.CallFinished(call=1, wg="g0", at=0.8, duration_s=0.8))
    assert done.running["g0"].call == 2 and done.running["g0"].started_at == 0.8
    assert done.behind == {} and check_snapshot(done) == []


def test_without_pipeline_the_call_waits_for_the_group():
    assert plan(running_a(CoreConfig(queue_policy="fcfs", prefetch=False)), 0.5) == []


def test_a_call_whose_states_are_not_resident_is_prefetched_not_sent():
    decisions = plan(running_a(b_tier=Tier.HOST), 0.5)
    assert decisions and all(isinstance(d, Move) and d.reason == "prefetch" for d in decisions)


@pytest.mark.parametrize("workspace, sent", [(280, True), (281, False)])
def test_a_call_is_sent_behind_only_if_its_workspace_fits_once_the_running_one_ends(workspace,
                                                                                   sent):
    """720 bytes of States and a's 100-byte workspace: b's workspace fits in the other 280
    once a's call ends, not before."""
    decisions = plan(running_a(b_workspace=workspace), 0.5)
    assert any(isinstance(d, Dispatch) for d in decisions) == sent, decisions


def test_a_sync_goes_behind_the_optim_step_that_makes_its_version():
    """The SYNC_WEIGHTS of version 1 needs the trainer at version 1: the running OPTIM_STEP
    makes it, and the sync runs after it on the same group, so it may go behind it."""
    snap = admitted(one_group(), rl_job("a", 20, "g0", "g0"), config=PIPELINE)
    snap = with_tiers(snap, {}, job_tiers={"a": Tier.DEVICE})
    snap = queue(snap, 1, "a", 0, Function.OPTIM_STEP, at=0.0)
    snap = dispatch(snap, 1, now=0.0)
    snap = queue(snap, 2, "a", 0, Function.SYNC_WEIGHTS, at=0.0, version=1)
    decisions = plan(snap, 0.1)
    assert [d.call for d in decisions if isinstance(d, Dispatch)] == [2]
    assert check_decisions(snap, decisions, 0.1) == []
    off = plan(replace(snap, config=CoreConfig(queue_policy="fcfs")), 0.1)
    assert not any(isinstance(d, Dispatch) for d in off)


def test_when_the_running_calls_job_ends_the_call_behind_starts():
    snap = running_a()
    snap = assume(snap, plan(snap, 0.5)[0], 0.5)
    ended = apply(snap, ev.JobEnded(job="a", at=0.7))
    assert ended.running["g0"].call == 2 and ended.running["g0"].started_at == 0.7
    assert ended.behind == {} and check_snapshot(ended) == []


def test_when_the_behind_calls_job_ends_it_is_dropped():
    snap = running_a()
    snap = assume(snap, plan(snap, 0.5)[0], 0.5)
    ended = apply(snap, ev.JobEnded(job="b", at=0.7))
    assert ended.running["g0"].call == 1 and ended.behind == {}
    assert key("b", State.WEIGHTS) not in ended.states


def test_a_call_goes_behind_only_near_the_running_calls_expected_end():
    """a's LOGPROBS is known to take 1 s: nothing is sent behind it before 1 s less the lead
    (a call queued meanwhile may still be the better pick), and the planner's quiet window
    for the group ends right then, so the runtime plans again at that time (D184)."""
    snap = running_a()
    snap = replace(snap, estimates=snap.estimates.observe_service("a", Function.LOGPROBS, 1.0,
                                                                  alpha=1.0))
    send_at = 1.0 - PIPELINE.pipeline_lead_s
    assert plan(snap, 0.5) == []
    assert snap.quiet_groups.windows["g0"][1] == pytest.approx(send_at)
    assert [d.call for d in plan(snap, send_at) if isinstance(d, Dispatch)] == [2]
