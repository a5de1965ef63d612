"""Rollout lanes (D202): a job's rollout copy split over several fleet groups, placed and
versioned lane by lane, and fleet groups shared by the lanes of several jobs."""

from __future__ import annotations

from dataclasses import replace

import pytest
from core_builders import admitted, cluster, dispatch, queue, rl_job, with_tiers

from plexrl.core import apply, plan
from plexrl.core import events as ev
from plexrl.core.decisions import Dispatch
from plexrl.core.invariants import check_step
from plexrl.core.planner import runnable
from plexrl.protocol import Copy, Function, Role, State, StateKey, Tier

FLEET = ("f0", "f1", "f2")


def _fleet(*jobs: str, lanes: int = 3):
    groups = {"t": (1, ("n0",)), **{g: (1, ("n0",)) for g in FLEET}}
    specs = [replace(rl_job(j, 50, "t", "f0"), rollout_lanes=lanes,
                     candidates=((Role.POLICY, Copy.TRAINER, ("t",)),
                                 (Role.POLICY, Copy.ROLLOUT, FLEET))) for j in jobs]
    return admitted(cluster(groups, {"n0": 1e9}), *specs)


def _weights(job: str, lane: int) -> StateKey:
    return StateKey(job, Role.POLICY, Copy.ROLLOUT, State.WEIGHTS, lane)


def test_each_lane_is_bound_to_its_own_group_with_its_own_states():
    snap = _fleet("a", "b")
    for job in ("a", "b"):
        bindings = snap.jobs[job].bindings
        lanes = [bindings[(Role.POLICY, Copy.ROLLOUT)], bindings[(Role.POLICY, Copy.ROLLOUT, 1)],
                 bindings[(Role.POLICY, Copy.ROLLOUT, 2)]]
        assert sorted(lanes) == list(FLEET)            # one lane per group, every group used
        for lane, wg in enumerate(lanes):
            assert snap.states[_weights(job, lane)].wg == wg
    assert snap.num_bound_jobs["f1"] == 2              # the groups hold lanes of both jobs


def test_more_lanes_than_groups_doubles_up_evenly():
    snap = _fleet("a", lanes=6)
    on = [snap.jobs["a"].bindings[(Role.POLICY, Copy.ROLLOUT) + ((i,) if i else ())] for i in range(6)]
    assert sorted(on) == sorted(FLEET * 2)


def test_a_lanes_generate_runs_on_its_group_and_waits_for_that_lanes_version():
    snap = _fleet("a")
    lane1 = snap.jobs["a"].bindings[(Role.POLICY, Copy.ROLLOUT, 1)]
    resident = {replace(_weights("a", lane), state=s): Tier.DEVICE
                for lane in range(3) for s in (State.WEIGHTS, State.KV_CACHE)}
    snap = with_tiers(snap, resident, versions={_weights("a", 0): 1})
    snap = queue(snap, 1, "a", 0, Function.GENERATE, version=1, lane=1)
    assert snap.queued[0].wg == lane1
    assert runnable(snap, lane1) == []                 # lane 0 has version 1, lane 1 has not
    synced = with_tiers(snap, {}, versions={_weights("a", 1): 1})
    decisions = [d for d in plan(synced, 0.0) if isinstance(d, Dispatch)]
    assert [(d.call, d.wg) for d in decisions] == [(1, lane1)]
    assert all(k.lane == 1 for k in decisions[0].uses)


def test_a_sync_installs_its_version_on_its_lane_only():
    snap = _fleet("a")
    trainer = StateKey("a", Role.POLICY, Copy.TRAINER, State.WEIGHTS)
    snap = with_tiers(snap, {_weights("a", 2): Tier.DEVICE}, versions={trainer: 1})
    snap = queue(snap, 1, "a", 0, Function.SYNC_WEIGHTS, version=1, lane=2)
    running = dispatch(snap, 1)
    wg = running.running[snap.queued[0].wg].wg
    done = apply(running, ev.CallFinished(call=1, wg=wg, at=2.0, duration_s=2.0))
    assert not check_step(running, done)
    assert [done.states[_weights("a", lane)].version for lane in range(3)] == [0, 0, 1]


def test_a_call_on_a_lane_the_job_does_not_have_is_refused():
    snap = _fleet("a", lanes=2)
    with pytest.raises(KeyError, match="lane 2"):
        queue(snap, 1, "a", 0, Function.GENERATE, lane=2)
