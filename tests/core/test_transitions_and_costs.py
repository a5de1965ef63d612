"""Transition planning (``make_resident``, ``switch_in_s``), learned costs, and placement.

Sizes are the tiny ones of ``core_builders``: a device holds 1000 bytes; a trainer copy of
P parameters on one device holds WEIGHTS 2P, GRADS 4P, OPTIMIZER 12P; a frozen model only
WEIGHTS 2P; a rollout copy WEIGHTS 2P and a KV cache of the rest. Bandwidths are 100 B/s
for onload/offload and 50 B/s for spill/restore, per lane.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from core_builders import (admitted, call_view, cluster, dispatch, key, one_group, queue, rl_job,
                           rollout_job, trainer_job, with_tiers)
from plexrl.core import apply, assume, plan
from plexrl.core import events as ev
from plexrl.core.cluster import ClusterSpec, DeviceSpec, Direction, NodeSpec, WorkerGroupSpec
from plexrl.core.costs import cold_service_s, service_s, transfer_s
from plexrl.core.decisions import Dispatch, Move, Place, Reject
from plexrl.core.invariants import check_decisions
from plexrl.core.jobs import JobSpec, ModelDecl
from plexrl.core.placement import GiB, RolloutDemand, admit, rollout_s, size_rollout_pool
from plexrl.core.queues import Candidate, HrrsQueue
from plexrl.core.snapshot import CoreConfig, Snapshot
from plexrl.core.transitions import make_resident, needed_keys, switch_in_s
from plexrl.core.usage import host_used
from plexrl.protocol import Copy, Function, ModelSpec, Role, State, Tier

W, G, O, KV = State.WEIGHTS, State.GRADS, State.OPTIMIZER, State.KV_CACHE
FB, LOGPROBS, GENERATE = Function.FORWARD_BACKWARD, Function.LOGPROBS, Function.GENERATE
DEVICE, HOST, DISK, DROPPED = Tier.DEVICE, Tier.HOST, Tier.DISK, Tier.DROPPED


def resident_for(snap: Snapshot, call: int, protect=()) -> list[Move]:
    view = call_view(snap, call)
    return make_resident(snap, view.wg, needed_keys(snap, view), view.workspace_bytes,
                         protect=tuple(protect), reason="onload", for_call=call)


def land(snap: Snapshot, moves: list[Move], duration_s: float = 1.0) -> Snapshot:
    """Start the moves, then let every one of them finish."""
    for move in moves:
        snap = assume(snap, move, 0.0)
    for m in moves:
        snap = apply(snap, ev.TransitionFinished(m.key, m.src, m.dst, m.num_bytes, at=duration_s,
                                                 duration_s=duration_s))
    return snap


def summary(moves: list[Move]) -> list[tuple]:
    return [(m.key.job, m.key.state, m.src, m.dst, m.reason) for m in moves]


# ------------------------------------------------------------------- make_resident: eviction

def test_kv_cache_is_dropped_first_even_when_a_larger_state_could_go():
    # r: rollout-only P=400 -> WEIGHTS 800 (parked), KV 200 (resident); c: frozen P=300 -> 600
    snap = admitted(one_group(), rollout_job("r", 400), trainer_job("c", 300, trainable=False),
                    trainer_job("b", 150, trainable=False))
    snap = with_tiers(snap, {key("r", KV, Copy.ROLLOUT): DEVICE}, job_tiers={"c": DEVICE})
    snap = queue(snap, 7, "b", 0, LOGPROBS)   # b needs 300, 200 free: short by 100
    moves = resident_for(snap, 7)
    assert moves == [Move(key("r", KV, Copy.ROLLOUT), DEVICE, DROPPED, 200, "g0", "evict", 7)]
    # dropping is free: no seconds, and no host memory taken
    assert transfer_s(snap, "g0", DEVICE, DROPPED, 200) == 0.0
    assert host_used(assume(snap, moves[0], 0.0)) == host_used(snap)
    assert plan(snap, 0.0) == moves


@pytest.mark.parametrize("params_b, evicted", [
    (75, [O]),          # short by 50: the largest state alone (600), not the smallest (100)
    (400, [O, G]),      # short by 700: largest first until covered, WEIGHTS stay
])
def test_evicts_largest_first_to_host_and_onloads_only_after_they_land(params_b, evicted):
    snap = admitted(one_group(), trainer_job("c", 50), trainer_job("b", params_b, trainable=False))
    snap = queue(with_tiers(snap, {}, job_tiers={"c": DEVICE}), 1, "b", 0, LOGPROBS)
    moves = resident_for(snap, 1)
    assert summary(moves) == [("c", s, DEVICE, HOST, "evict") for s in evicted]
    assert all(m.for_call == 1 for m in moves)
    assert plan(snap, 0.0) == moves
    snap = land(snap, moves)
    assert summary(resident_for(snap, 1)) == [("b", W, HOST, DEVICE, "onload")]


def test_spills_parked_states_of_the_same_node_to_disk_when_host_is_short():
    # g0 and g1 share node n0 (850 bytes of host); g2 sits on n1
    clus = cluster({"g0": (1, ("n0",)), "g1": (1, ("n0",)), "g2": (1, ("n1",))},
                   {"n0": 850.0, "n1": 950.0})
    snap = admitted(clus, trainer_job("c", 50, "g0"), trainer_job("b", 75, "g0", trainable=False),
                    trainer_job("e", 25, "g1"), trainer_job("f", 50, "g2"))
    snap = with_tiers(snap, {}, job_tiers={"c": DEVICE, "b": HOST, "e": HOST, "f": HOST})
    snap = queue(snap, 1, "b", 0, LOGPROBS)
    # evicting c's OPTIMIZER (600) needs 600 of host; n0 has 850 - 150 (b) - 450 (e) = 250
    moves = resident_for(snap, 1)
    assert summary(moves) == [("e", O, HOST, DISK, "spill"), ("e", G, HOST, DISK, "spill")]
    assert [m.wg for m in moves] == ["g1", "g1"]      # each spill on its own State's group
    assert not check_decisions(snap, plan(snap, 0.0), 0.0)
    snap = land(snap, moves)
    assert summary(resident_for(snap, 1)) == [("c", O, DEVICE, HOST, "evict")]


def test_spill_skips_pinned_and_needed_states():
    clus = cluster({"g0": (1, ("n0",)), "g1": (1, ("n0",))}, {"n0": 1100.0})
    # e's OPTIMIZER (300) is pinned to HOST (ZeRO-offload): the largest, but never spilled
    # e first: a pinned State needs host room at admission (later jobs' States go to DISK)
    snap = admitted(clus, trainer_job("e", 25, "g1", optimizer="adamw-offload"),
                    trainer_job("c", 50, "g0"), trainer_job("b", 75, "g0", trainable=False))
    assert snap.states[key("e", O)].pinned and snap.states[key("e", O)].tier == HOST
    snap = with_tiers(snap, {}, job_tiers={"c": DEVICE, "b": HOST, "e": HOST})
    snap = queue(snap, 1, "b", 0, LOGPROBS)
    # host room 1100 - 600 = 500 < 600 evicted: spill 100, not b's needed WEIGHTS (150)
    assert summary(resident_for(snap, 1)) == [("e", G, HOST, DISK, "spill")]


def test_restores_disk_to_host_before_onloading():
    snap = admitted(one_group(latency_s=0.0), trainer_job("a", 25))
    snap = with_tiers(snap, {key("a", W): DISK})
    snap = queue(snap, 1, "a", 0, FB)
    moves = resident_for(snap, 1)
    assert summary(moves) == [("a", W, DISK, HOST, "restore"), ("a", G, HOST, DEVICE, "onload"),
                              ("a", O, HOST, DEVICE, "onload")]
    snap = land(snap, moves)
    assert summary(resident_for(snap, 1)) == [("a", W, HOST, DEVICE, "onload")]
    snap = land(snap, resident_for(snap, 1))
    assert resident_for(snap, 1) == []
    assert plan(snap, 0.0) == [Dispatch(1, "g0", (key("a", W), key("a", G), key("a", O)))]


def test_restore_waits_for_host_room_and_counts_against_it_with_evictions():
    # host 1650: c (900) is on DEVICE, b's GRADS+OPTIMIZER (800) parked, b's WEIGHTS on DISK
    snap = admitted(one_group(host_bytes=1650.0), trainer_job("c", 50), trainer_job("b", 50))
    snap = with_tiers(snap, {key("b", W): DISK}, job_tiers={"c": DEVICE, "b": HOST})
    snap = queue(snap, 1, "b", 0, FB)
    decisions = plan(snap, 0.0)
    # the restore (100) and the evictions (800) would need 900 of the 850 free: only the
    # restore may start, and no host budget is broken on the way
    assert summary(decisions) == [("b", W, DISK, HOST, "restore")]
    assert not check_decisions(snap, decisions, 0.0)


def test_never_evicts_protected_states():
    snap = admitted(one_group(), trainer_job("c", 50), trainer_job("b", 75, trainable=False))
    snap = queue(with_tiers(snap, {}, job_tiers={"c": DEVICE}), 1, "b", 0, LOGPROBS)
    view = call_view(snap, 1)
    keys = needed_keys(snap, view)
    only_o = make_resident(snap, "g0", keys, 0, protect=(key("c", O),), reason="prefetch")
    assert summary(only_o) == [("c", G, DEVICE, HOST, "evict")]
    everything = (key("c", W), key("c", G), key("c", O))
    assert make_resident(snap, "g0", keys, 0, protect=everything, reason="prefetch") == []


def test_prefetch_never_evicts_the_running_calls_states():
    def running(function):
        snap = admitted(one_group(), trainer_job("c", 50), trainer_job("b", 75, trainable=False))
        snap = with_tiers(snap, {}, job_tiers={"c": DEVICE})
        return queue(dispatch(queue(snap, 1, "c", 0, function), 1), 2, "b", 0, LOGPROBS)

    # c's FORWARD_BACKWARD holds all of c's States: nothing can make room for b yet
    assert plan(running(FB), 0.0) == []
    # c's LOGPROBS needs only WEIGHTS: prefetch may evict its OPTIMIZER, never its WEIGHTS
    assert summary(plan(running(LOGPROBS), 0.0)) == [("c", O, DEVICE, HOST, "evict")]
    assert plan(replace(running(LOGPROBS), config=CoreConfig(prefetch=False)), 0.0) == []


def test_never_evicts_pinned_states():
    # p's OPTIMIZER (600) is pinned; put on DEVICE by hand it is still never chosen
    snap = admitted(one_group(), trainer_job("p", 50, optimizer="adamw-offload"),
                    trainer_job("q", 150, trainable=False), trainer_job("b", 75, trainable=False))
    snap = with_tiers(snap, {key("p", O): DEVICE}, job_tiers={"q": DEVICE})
    snap = queue(snap, 1, "b", 0, LOGPROBS)
    assert summary(resident_for(snap, 1)) == [("q", W, DEVICE, HOST, "evict")]
    snap = with_tiers(snap, {key("q", W): HOST, key("b", W): HOST})
    snap = queue(snap, 2, "p", 0, LOGPROBS)
    assert key("p", O) not in needed_keys(snap, call_view(snap, 2))


def test_returns_nothing_while_a_needed_state_is_in_flight():
    snap = admitted(one_group(), trainer_job("a", 25))
    snap = queue(snap, 1, "a", 0, FB)
    first = resident_for(snap, 1)
    assert len(first) == 3
    snap = assume(snap, first[0], 0.0)          # WEIGHTS now moving
    assert resident_for(snap, 1) == []
    assert plan(snap, 0.0) == []
    # an unrelated State in flight does not block
    snap2 = admitted(one_group(), trainer_job("a", 25), trainer_job("z", 10, trainable=False))
    snap2 = queue(snap2, 1, "a", 0, FB)
    snap2 = assume(snap2, Move(key("z", W), HOST, DISK, 20, "g0", "spill"), 0.0)
    assert len(resident_for(snap2, 1)) == 3


def test_a_group_stays_committed_to_the_call_it_started_moving_for():
    """D6: once Moves started for call A, a call HRRS now prefers does not take A's place."""
    snap = admitted(one_group(), trainer_job("c", 50), trainer_job("a", 150, trainable=False),
                    trainer_job("b", 10, trainable=False))
    snap = with_tiers(snap, {}, job_tiers={"c": DEVICE})
    snap = queue(snap, 1, "a", 0, LOGPROBS, num_tokens=1000)          # long, 300 bytes to load
    evictions = plan(snap, 0.0)
    assert summary(evictions) == [("c", O, DEVICE, HOST, "evict")] and evictions[0].for_call == 1
    for move in evictions:
        snap = assume(snap, move, 0.0)
    snap = queue(snap, 2, "b", 0, LOGPROBS, num_tokens=10, at=1.0)     # short, 20 bytes
    snap = apply(snap, ev.TransitionFinished(key("c", O), DEVICE, HOST, 600, at=2.0,
                                             duration_s=2.0))
    calls = [call_view(snap, 1), call_view(snap, 2)]
    hrrs = HrrsQueue().pick([Candidate(c, 2.0 - c.queued_at, service_s(snap, c),
                                       switch_in_s(snap, c)) for c in calls], None, 600.0)
    assert hrrs.call.call == 2                                         # HRRS alone would switch
    onload = plan(snap, 2.0)
    assert summary(onload) == [("a", W, HOST, DEVICE, "onload")] and onload[0].for_call == 1
    snap = land(snap, onload)
    assert plan(snap, 3.0) == [Dispatch(1, "g0", (key("a", W),))]
    assert "g0" not in assume(snap, plan(snap, 3.0)[0], 3.0).onloading


# ------------------------------------------------------------------------------ switch_in_s

def test_switch_in_s_counts_restores_onloads_and_rebuilds():
    snap = admitted(one_group(latency_s=0.5), trainer_job("b", 75, trainable=False))
    snap = queue(snap, 1, "b", 0, LOGPROBS)
    call = call_view(snap, 1)
    assert switch_in_s(snap, call) == pytest.approx(0.5 + 150 / 100)             # HOST
    assert switch_in_s(with_tiers(snap, {key("b", W): DISK}), call) == pytest.approx(
        (0.5 + 150 / 50) + (0.5 + 150 / 100))                                     # DISK
    assert switch_in_s(with_tiers(snap, {key("b", W): DEVICE}), call) == 0.0      # resident
    moving = assume(with_tiers(snap, {key("b", W): DEVICE}),
                    Move(key("b", W), DEVICE, HOST, 150, "g0", "evict"), 0.0)
    assert switch_in_s(moving, call) > 0.0                                         # leaving
    # GENERATE: weights onload plus a KV rebuild (latency only)
    r = queue(admitted(one_group(latency_s=0.5), rollout_job("r", 50)), 2, "r", 0, GENERATE)
    assert switch_in_s(r, call_view(r, 2)) == pytest.approx((0.5 + 100 / 100) + 0.5)


def test_switch_in_s_divides_device_transfers_over_the_groups_devices():
    snap = admitted(cluster({"g0": (2, ("n0",))}, {"n0": 1e9}),
                    trainer_job("b", 75, trainable=False))
    snap = queue(snap, 1, "b", 0, LOGPROBS)
    # 2 devices: WEIGHTS = 2 * 75 * 2 = 300 bytes, 150 per lane
    assert snap.states[key("b", W)].num_bytes == 300
    assert switch_in_s(snap, call_view(snap, 1)) == pytest.approx(150 / 100)


# ------------------------------------------------------------------------ service-time costs

def _trainer_snap(alpha: float = 0.3) -> Snapshot:
    return admitted(one_group(), trainer_job("a", 50), trainer_job("b", 50),
                    config=CoreConfig(ema_alpha=alpha))


def test_cold_service_estimate_comes_from_the_model_spec():
    snap = queue(queue(_trainer_snap(), 1, "a", 0, FB, num_tokens=1000), 2, "a", 1, LOGPROBS,
                 num_tokens=1000)
    snap = queue(snap, 3, "a", 2, Function.OPTIM_STEP)
    # FORWARD_BACKWARD: 6 * 50 params * 1000 tokens / (0.3 MFU * 1e4 FLOP/s * 1 device)
    assert service_s(snap, call_view(snap, 1)) == pytest.approx(100.0)
    assert service_s(snap, call_view(snap, 2)) == pytest.approx(100.0 / 3)        # 2N per token
    assert service_s(snap, call_view(snap, 3)) == pytest.approx(2 * 50 / 1e4)      # read weights
    r = queue(admitted(one_group(), rollout_job("r", 50)), 4, "r", 0, GENERATE, num_tokens=6400)
    # decode: 6400 tokens * (2 * 50 bytes / 1e4 B/s) per step / (64 batch * 1 instance)
    assert service_s(r, call_view(r, 4)) == pytest.approx(1.0)


@pytest.mark.parametrize("alpha", [0.3, 0.25, 1.0])
def test_service_estimate_is_cold_until_a_call_finishes_then_an_ema(alpha):
    snap = with_tiers(_trainer_snap(alpha), {}, job_tiers={"a": DEVICE})
    snap = queue(snap, 1, "a", 0, FB, num_tokens=1000)
    cold = cold_service_s(snap, call_view(snap, 1))
    assert service_s(snap, call_view(snap, 1)) == cold == pytest.approx(100.0)

    snap = apply(dispatch(snap, 1), ev.CallFinished(call=1, wg="g0", at=40.0, duration_s=40.0))
    snap = queue(snap, 2, "a", 1, FB, num_tokens=1000, at=40.0)
    assert service_s(snap, call_view(snap, 2)) == 40.0          # first observation is taken whole

    snap = apply(dispatch(snap, 2, 40.0),
                 ev.CallFinished(call=2, wg="g0", at=50.0, duration_s=10.0))
    snap = queue(snap, 3, "a", 2, FB, num_tokens=1000, at=50.0)
    assert service_s(snap, call_view(snap, 3)) == pytest.approx(40.0 + alpha * (10.0 - 40.0))

    # other functions of the job and other jobs stay cold
    snap = queue(queue(snap, 4, "a", 3, LOGPROBS, num_tokens=1000), 5, "b", 0, FB, num_tokens=1000)
    assert service_s(snap, call_view(snap, 4)) == pytest.approx(100.0 / 3)
    assert service_s(snap, call_view(snap, 5)) == pytest.approx(100.0)


# ---------------------------------------------------------------------- learned bandwidths

def _bandwidth_snap(latency_s: float = 0.5, alpha: float = 0.3) -> Snapshot:
    clus = cluster({"g0": (1, ("n0",)), "g1": (1, ("n1",)), "g2": (2, ("n0",))},
                   {"n0": 1e9, "n1": 1e9}, latency_s=latency_s)
    return admitted(clus, trainer_job("a", 50, "g0"), trainer_job("b", 50, "g1"),
                    trainer_job("c", 50, "g2", trainable=False), config=CoreConfig(ema_alpha=alpha))


def _finished(snap, job, src, dst, num_bytes, duration_s):
    k = key(job, W)
    snap = assume(snap, Move(k, src, dst, num_bytes, snap.states[k].wg, "onload"), 0.0)
    return apply(snap, ev.TransitionFinished(k, src, dst, num_bytes, at=duration_s,
                                             duration_s=duration_s))


def test_a_finished_transition_teaches_the_bandwidth_of_its_node_and_direction():
    snap = _bandwidth_snap(alpha=0.3)
    nominal = transfer_s(snap, "g0", HOST, DEVICE, 100)
    assert nominal == pytest.approx(0.5 + 100 / 100)
    # 100 bytes really took 0.5 s latency + 4 s: 25 B/s achieved
    snap = _finished(snap, "a", HOST, DEVICE, 100, 4.5)
    assert snap.estimates.bytes_per_s[("n0", Direction.ONLOAD)] == pytest.approx(25.0)
    assert transfer_s(snap, "g0", HOST, DEVICE, 100) == pytest.approx(4.5)
    # other directions and other nodes keep their nominal figures
    assert transfer_s(snap, "g0", DEVICE, HOST, 100) == pytest.approx(0.5 + 100 / 100)
    assert transfer_s(snap, "g1", HOST, DEVICE, 100) == pytest.approx(0.5 + 100 / 100)
    # a second observation (50 B/s) moves the EMA by alpha toward it
    snap = apply(assume(snap, Move(key("a", W), DEVICE, HOST, 100, "g0", "evict"), 0.0),
                 ev.TransitionFinished(key("a", W), DEVICE, HOST, 100, at=5.0, duration_s=1.5))
    snap = _finished(snap, "a", HOST, DEVICE, 100, 0.5 + 100 / 50)
    assert snap.estimates.bytes_per_s[("n0", Direction.ONLOAD)] == pytest.approx(
        25.0 + 0.3 * (50.0 - 25.0))


def test_estimates_converge_monotonically_toward_the_achieved_bandwidth():
    snap = _bandwidth_snap(latency_s=0.0, alpha=0.3)
    snap = _finished(snap, "a", HOST, DEVICE, 100, 100 / 10)                 # 10 B/s first
    seen = [transfer_s(snap, "g0", HOST, DEVICE, 100)]
    for _ in range(12):                                                    # then 40 B/s
        snap = apply(assume(snap, Move(key("a", W), DEVICE, HOST, 100, "g0", "evict"), 0.0),
                     ev.TransitionFinished(key("a", W), DEVICE, HOST, 100, at=1.0, duration_s=2.5))
        snap = _finished(snap, "a", HOST, DEVICE, 100, 100 / 40)
        seen.append(transfer_s(snap, "g0", HOST, DEVICE, 100))
    assert all(later < earlier for earlier, later in zip(seen, seen[1:]))
    assert seen[-1] == pytest.approx(100 / 40, rel=0.05)
    assert seen[-1] > 100 / 40


def test_bandwidth_is_learned_per_lane_so_predictions_match_what_was_seen():
    snap = _bandwidth_snap(latency_s=0.5)
    # c's WEIGHTS on the 2-device g2: 2 * 50 * 2 = 200 bytes, 100 per lane; took 0.5 + 2 s
    nbytes = snap.states[key("c", W)].num_bytes
    assert nbytes == 200
    snap = _finished(snap, "c", HOST, DEVICE, nbytes, 2.5)
    assert snap.estimates.bytes_per_s[("n0", Direction.ONLOAD)] == pytest.approx(50.0)
    assert transfer_s(snap, "g2", HOST, DEVICE, 200) == pytest.approx(2.5)


def test_drops_and_too_short_transitions_teach_nothing():
    snap = _bandwidth_snap(latency_s=0.5)
    before = snap.estimates
    snap = _finished(snap, "a", HOST, DEVICE, 100, 0.5)      # no time beyond the latency
    assert snap.estimates == before
    r = admitted(one_group(), rollout_job("r", 50))
    kv = key("r", KV, Copy.ROLLOUT)
    r = apply(assume(r, Move(kv, DROPPED, DEVICE, 900, "g0", "rebuild"), 0.0),
              ev.TransitionFinished(kv, DROPPED, DEVICE, 900, at=3.0, duration_s=3.0))
    assert r.estimates.bytes_per_s == {}


# ------------------------------------------------------------------------------- placement

def test_admit_places_on_the_candidate_with_fewest_bound_jobs():
    clus = cluster({"g0": (1, ("n0",)), "g1": (2, ("n0",)), "g2": (1, ("n1",))},
                   {"n0": 1e9, "n1": 1e9})
    snap = admitted(clus, trainer_job("x", 10, "g0", trainable=False),
                    trainer_job("y", 10, "g1", trainable=False))
    every = ("g0", "g1", "g2")
    assert admit(snap, trainer_job("z", 10, every, trainable=False)) == [
        Place("z", Role.POLICY, Copy.TRAINER, "g2")]
    # one bound job each on g0 and g1: the larger group (g1, 2 devices) wins
    assert admit(snap, trainer_job("w", 10, ("g0", "g1"), trainable=False))[0].wg == "g1"
    # equal count and size: by id
    snap = admitted(clus, trainer_job("x", 10, "g0", trainable=False),
                    trainer_job("z", 10, "g2", trainable=False))
    assert admit(snap, trainer_job("v", 10, ("g2", "g0"), trainable=False))[0].wg == "g0"
    # a group the model does not fit is filtered out however empty it is:
    # P=70 trained needs 18 * 70 = 1260 bytes on one device, 2*(6*70)+12*70 = 1680 on g1's 2000
    snap = admitted(clus, trainer_job("x", 10, "g1", trainable=False),
                    trainer_job("y", 10, "g1", trainable=False))
    assert admit(snap, trainer_job("big", 70, every))[0].wg == "g1"


def test_admit_places_every_copy_and_counts_earlier_copies_of_the_same_plan():
    clus = cluster({"g0": (1, ("n0",)), "g1": (1, ("n0",))}, {"n0": 1e9})
    snap = Snapshot(cluster=clus)
    for spec in (rl_job("a", 10, "g0", "g1"), trainer_job("b", 10, ("g0", "g1"), trainable=False)):
        snap = apply(snap, ev.JobSubmitted(spec=spec, at=0.0))
    decisions = plan(snap, 0.0)
    assert decisions == [Place("a", Role.POLICY, Copy.TRAINER, "g0"),
                         Place("a", Role.POLICY, Copy.ROLLOUT, "g1"),
                         Place("b", Role.POLICY, Copy.TRAINER, "g0")]


def test_a_new_jobs_states_start_on_disk_when_host_memory_is_short():
    # 700 bytes of host: a's WEIGHTS (100) and GRADS (200) fit, then its OPTIMIZER (600) does
    # not (it could pass through host memory alone, which admission requires)
    snap = admitted(one_group(host_bytes=700.0), trainer_job("a", 50))
    assert {k.state: v.tier for k, v in snap.states.items()} == {W: HOST, G: HOST, O: DISK}
    # jobs admitted in one plan share the room; the plan keeps the host budget
    snap = Snapshot(cluster=one_group(host_bytes=1000.0))
    for job in ("a", "b"):
        snap = apply(snap, ev.JobSubmitted(trainer_job(job, 50), 0.0))
    decisions = plan(snap, 0.0)
    assert check_decisions(snap, decisions, 0.0) == []
    for decision in decisions:
        snap = assume(snap, decision, 0.0)
    assert sorted((k.job, k.state, v.tier) for k, v in snap.states.items()) == [
        ("a", G, HOST), ("a", O, HOST), ("a", W, HOST),
        ("b", G, DISK), ("b", O, DISK), ("b", W, HOST)]


def test_a_job_whose_pinned_state_finds_no_host_room_waits_pending():
    # a's States fill the 900 bytes of host; p's pinned OPTIMIZER (600) must wait for room
    snap = Snapshot(cluster=one_group(host_bytes=900.0))
    for spec in (trainer_job("a", 50), trainer_job("p", 50, optimizer="adamw-offload")):
        snap = apply(snap, ev.JobSubmitted(spec, 0.0))
    decisions = plan(snap, 0.0)
    assert check_decisions(snap, decisions, 0.0) == []
    assert "p" not in {d.job for d in decisions if isinstance(d, Place)}
    for decision in decisions:
        snap = assume(snap, decision, 0.0)
    assert [s.job for s in snap.pending] == ["p"]


def _big_cluster() -> ClusterSpec:
    h100 = DeviceSpec("h100", memory_bytes=80 * GiB, usable_frac=0.9, peak_flops=989e12,
                      hbm_bytes_per_s=3.35e12)
    node = NodeSpec("n0", 16, h100, 2e12, 1e13, {d: 25e9 for d in Direction})
    return ClusterSpec(nodes={"n0": node},
                       worker_groups={"train8": WorkerGroupSpec("train8", ("n0",), 8),
                                      "train4": WorkerGroupSpec("train4", ("n0",), 4)})


def test_admit_rejects_a_model_that_fits_no_group_with_both_sizes_in_gib():
    spec70 = ModelSpec("dense-70b", 70e9, 70e9, 80, 8, 128)
    job = JobSpec("big", (ModelDecl(Role.POLICY, spec70),),
                  ((Role.POLICY, Copy.TRAINER, ("train8", "train4")),))
    snap = apply(Snapshot(cluster=_big_cluster()), ev.JobSubmitted(job, 0.0))
    decisions = plan(snap, 0.0)
    assert len(decisions) == 1 and isinstance(decisions[0], Reject)
    reason = decisions[0].reason
    # 8 ranks: (2 + 4) * 70e9 * 8 + 12 * 70e9 bytes; 8 devices * 80 GiB * 0.9 usable
    need8, have8 = (6 * 70e9 * 8 + 12 * 70e9) / GiB, 8 * 80 * 0.9
    need4, have4 = (6 * 70e9 * 4 + 12 * 70e9) / GiB, 4 * 80 * 0.9
    for text in (f"{need8:.1f} GiB", f"{have8:.1f} GiB", f"{need4:.1f} GiB", f"{have4:.1f} GiB",
                 "big", "dense-70b", "train8", "train4"):
        assert text in reason, (text, reason)
    after = assume(snap, decisions[0], 0.0)
    assert after.pending == () and "big" not in after.jobs


# ---------------------------------------------------------------------- rollout-pool sizing

def _demand(tail_tokens: float, **overrides) -> RolloutDemand:
    fields = dict(num_samples=4096, prompt_tokens=500, mean_tokens=1500, tail_tokens=tail_tokens,
                  devices_per_instance=1, t0_s=0.003, weight_read_s=0.005,
                  kv_read_s_per_token=1e-8, max_live_tokens=200_000, rest_of_step_s=20.0,
                  shared_devices=8.0)
    fields.update(overrides)
    return RolloutDemand(**fields)


CHOICES = (1, 2, 4, 8, 16, 32)


def _gpu_s(d: RolloutDemand, n: int) -> float:
    return (n * d.devices_per_instance + d.shared_devices) * (rollout_s(d, n) + d.rest_of_step_s)


def test_rollout_makespan_by_hand():
    # 1 instance: 100 live samples (200k KV tokens / 2000), context 100 * (500 + 750) tokens,
    # step 3 + 5 + 1.25 ms; 4096 samples * 1500 tokens / 100 live steps
    assert rollout_s(_demand(2000), 1) == pytest.approx(4096 * 1500 / 100 * 0.00925)
    # the tail bound: 64k tokens of one sequence at (500 + 32k) context, whatever the pool
    tail = 64000 * (0.008 + (500 + 32000) * 1e-8)
    assert rollout_s(_demand(64000), 32) == pytest.approx(tail)


@pytest.mark.parametrize("tail_tokens", [2000, 8000, 16000, 64000])
def test_size_rollout_pool_picks_the_cheapest_choice(tail_tokens):
    d = _demand(tail_tokens)
    best = size_rollout_pool(d, CHOICES)
    assert _gpu_s(d, best) == min(_gpu_s(d, n) for n in CHOICES)
    assert best == min(CHOICES, key=lambda n: (_gpu_s(d, n), n))


def test_longer_tails_favour_fewer_instances():
    picks = [size_rollout_pool(_demand(t), CHOICES) for t in (2000, 8000, 16000, 32000, 64000)]
    assert picks == sorted(picks, reverse=True)
    assert picks[0] > picks[-1]
    assert size_rollout_pool(_demand(2000), CHOICES) != size_rollout_pool(_demand(16000), CHOICES)
