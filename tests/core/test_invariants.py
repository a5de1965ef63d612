"""Every numbered invariant is caught, by name, when a deliberately broken planner breaks it.

For each member of ``Invariant`` the table below holds one or more broken planners: a wrapper
around ``plan`` or a hand-built decision list on a hand-built snapshot. Each case also runs
the honest planner (or the honest driver step) on the same snapshot, which must be clean, so
a checker that always fires would fail too. Adding an invariant without a broken planner
fails ``test_every_invariant_has_a_broken_planner``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, NamedTuple

import pytest

from core_builders import (admitted, call_view, cluster, dispatch, key, model, one_group, queue,
                           rl_job, trainer_job, with_tiers)
from plexrl.core import apply, assume, plan
from plexrl.core import events as ev
from plexrl.core.cluster import WorkerGroupSpec
from plexrl.core.decisions import Dispatch, Move, Place
from plexrl.core.jobs import JobSpec, ModelDecl, PoolRequest
from plexrl.core.snapshot import Snapshot
from plexrl.core.invariants import (Invariant, Violation, check_decisions, check_snapshot,
                                    check_step, enforce)
from plexrl.core.transitions import needed_keys
from plexrl.errors import InvariantError, PlexError
from plexrl.protocol import Copy, Function, Role, State, Tier

FB, LOGPROBS = Function.FORWARD_BACKWARD, Function.LOGPROBS
W, G, O, KV = State.WEIGHTS, State.GRADS, State.OPTIMIZER, State.KV_CACHE


class Case(NamedTuple):
    broken: list[Violation]      #: what the checker says of the broken planner's output
    honest: list[Violation]      #: what it says of the honest planner on the same snapshot


def _checked(snap, broken: list, now: float = 0.0) -> Case:
    return Case(check_decisions(snap, broken, now), check_decisions(snap, plan(snap, now), now))


def _resident_a():
    """Job a (trainer, 900 bytes) resident on the one 1000-byte group."""
    return with_tiers(admitted(one_group(), trainer_job("a", 50)), {}, job_tiers={"a": Tier.DEVICE})


# ----------------------------------------------------------------------------- 1 SINGLE_COPY

def move_twice() -> Case:
    """A planner that issues the same onload twice: the second starts from a moving copy."""
    snap = queue(admitted(one_group(), trainer_job("a", 50)), 1, "a", 0, FB)
    moves = plan(snap, 0.0)
    return _checked(snap, moves + moves[:1])


def move_to_own_tier() -> Case:
    """A planner that 'moves' a parked State from HOST to HOST: two copies on one tier."""
    snap = queue(admitted(one_group(), trainer_job("a", 50)), 1, "a", 0, FB)
    k = key("a", W)
    return _checked(snap, [Move(k, Tier.HOST, Tier.HOST, 100, "g0", "onload", 1)])


def move_from_stale_tier() -> Case:
    """A planner that believes a State is on DISK while its copy is on HOST."""
    snap = queue(admitted(one_group(), trainer_job("a", 50)), 1, "a", 0, FB)
    return _checked(snap, [Move(key("a", W), Tier.DISK, Tier.HOST, 100, "g0", "restore", 1)])


# --------------------------------------------------------------------------- 2 DEVICE_BUDGET

def onload_without_evicting() -> Case:
    """Device full of job a; a planner onloads job b's States without evicting first."""
    snap = admitted(one_group(), trainer_job("a", 50), trainer_job("b", 50))
    snap = queue(with_tiers(snap, {}, job_tiers={"a": Tier.DEVICE}), 1, "b", 0, FB)
    call = call_view(snap, 1)
    broken = [Move(k, Tier.HOST, Tier.DEVICE, snap.states[k].num_bytes, "g0", "onload", 1)
              for k in needed_keys(snap, call)]
    return _checked(snap, broken)


def dispatch_ignoring_workspace() -> Case:
    """A planner that dispatches a resident call whose workspace does not fit."""
    snap = queue(_resident_a(), 1, "a", 0, LOGPROBS, workspace_bytes=200)
    return _checked(snap, [Dispatch(1, "g0", (key("a", W),))])


# ----------------------------------------------------------------------------- 3 HOST_BUDGET

def evict_without_spilling() -> Case:
    """Host short: the honest planner spills job c to DISK; a broken one evicts to HOST anyway."""
    clus = cluster({"g0": (1, ("n0",)), "g1": (1, ("n0",))}, {"n0": 1100.0})
    snap = admitted(clus, trainer_job("a", 50, "g0"), trainer_job("b", 75, "g0", trainable=False),
                    trainer_job("c", 25, "g1"))
    snap = with_tiers(snap, {}, job_tiers={"a": Tier.DEVICE, "b": Tier.HOST, "c": Tier.HOST})
    snap = queue(snap, 1, "b", 0, LOGPROBS)
    assert not check_snapshot(snap)
    return _checked(snap, [Move(key("a", O), Tier.DEVICE, Tier.HOST, 600, "g0", "evict", 1)])


# -------------------------------------------------------------------------------- 4 RESIDENT

def dispatch_before_onload_lands() -> Case:
    """A planner that dispatches as soon as it has issued the onloads, not when they land."""
    snap = queue(admitted(one_group(), trainer_job("a", 50)), 1, "a", 0, FB)
    moves = plan(snap, 0.0)
    return _checked(snap, moves + [Dispatch(1, "g0", needed_keys(snap, call_view(snap, 1)))])


def evict_running_call_state() -> Case:
    """A prefetching planner that evicts a State of the call that is running."""
    snap = admitted(one_group(), trainer_job("a", 50), trainer_job("b", 75, trainable=False))
    snap = dispatch(queue(with_tiers(snap, {}, job_tiers={"a": Tier.DEVICE}), 1, "a", 0, FB), 1)
    snap = queue(snap, 2, "b", 0, LOGPROBS)
    return _checked(snap, [Move(key("a", O), Tier.DEVICE, Tier.HOST, 600, "g0", "prefetch")])


# ----------------------------------------------------------------------------------- 5 ORDER

def dispatch_out_of_order() -> Case:
    """A planner that runs a job's second call on a copy before its first."""
    snap = queue(queue(_resident_a(), 1, "a", 0, LOGPROBS), 2, "a", 1, FB)
    return _checked(snap, [Dispatch(2, "g0", (key("a", W), key("a", G), key("a", O)))])


def dispatch_twice() -> Case:
    """A planner whose plan dispatches the same call twice."""
    snap = queue(_resident_a(), 1, "a", 0, LOGPROBS)
    return _checked(snap, plan(snap, 0.0) * 2)


# ------------------------------------------------------------------------------- 6 ISOLATION

def dispatch_with_foreign_state() -> Case:
    """A planner that hands job a's call a State of job b (both resident)."""
    snap = admitted(one_group(), trainer_job("a", 50), trainer_job("b", 50, trainable=False))
    snap = with_tiers(snap, {}, job_tiers={"a": Tier.DEVICE, "b": Tier.DEVICE})
    snap = queue(snap, 1, "a", 0, LOGPROBS)
    return _checked(snap, [Dispatch(1, "g0", (key("a", W), key("b", W)))])


# ------------------------------------------------------------------------- 7 VERSION_FORWARD

def _rollout_at_version(version: int, sync_to: int):
    clus = cluster({"g0": (1, ("n0",)), "g1": (1, ("n0",))}, {"n0": 1e9})
    snap = admitted(clus, rl_job("a", 50, "g0", "g1"))
    rollout_w, trainer_w = key("a", W, Copy.ROLLOUT), key("a", W, Copy.TRAINER)
    snap = with_tiers(snap, {rollout_w: Tier.DEVICE},
                      versions={rollout_w: version, trainer_w: max(version, sync_to)})
    return queue(snap, 1, "a", 0, Function.SYNC_WEIGHTS, version=sync_to)


def _sync_step(snap):
    """The honest driver step: plan, assume, the call finishes; check_step on the way."""
    decisions = plan(snap, 0.0)
    assert [type(x) for x in decisions] == [Dispatch] and not check_decisions(snap, decisions, 0.0)
    for decision in decisions:
        snap = assume(snap, decision, 0.0)
    return snap, apply(snap, ev.CallFinished(call=1, wg="g1", at=1.0, duration_s=1.0))


def stale_sync_installed() -> Case:
    """A broken planner dispatches a sync of version 1 onto rollout weights at version 2.

    The honest planner holds that sync back; the checker catches it at dispatch."""
    snap = _rollout_at_version(2, sync_to=1)
    assert plan(snap, 0.0) == []
    broken = check_decisions(snap, [Dispatch(1, "g1", (key("a", W, Copy.ROLLOUT),))], 0.0)
    honest = check_step(*_sync_step(_rollout_at_version(2, sync_to=3)))
    return Case(broken, honest)


def eviction_resets_version() -> Case:
    """A broken ledger step that loses the version of evicted weights (back to 0)."""
    before = with_tiers(_resident_a(), {}, versions={key("a", W): 4})
    k = key("a", W)
    moved = replace(before.states[k], tier=Tier.HOST)
    honest_after = replace(before, states={**before.states, k: moved})
    broken_after = replace(before, states={**before.states, k: replace(moved, version=0)})
    return Case(check_step(before, broken_after), check_step(before, honest_after))


# ------------------------------------------------------------------------------- 8 STALENESS

def _rollout_snap(staleness: int, weights_version: int):
    clus = cluster({"g0": (1, ("n0",)), "g1": (1, ("n0",))}, {"n0": 1e9})
    snap = admitted(clus, rl_job("a", 50, "g0", "g1", staleness=staleness))
    rw, kv = key("a", W, Copy.ROLLOUT), key("a", KV, Copy.ROLLOUT)
    return with_tiers(snap, {rw: Tier.DEVICE, kv: Tier.DEVICE}, versions={rw: weights_version})


def generate_before_sync() -> Case:
    """A planner that ignores versions: GENERATE of step 1 (needs version 1) on version 0."""
    snap = queue(_rollout_snap(0, 0), 1, "a", 0, Function.GENERATE, step=1, version=1)
    assert plan(snap, 0.0) == []  # the honest planner holds the call until the sync lands
    keys = (key("a", W, Copy.ROLLOUT), key("a", KV, Copy.ROLLOUT))
    return _checked(snap, [Dispatch(1, "g1", keys)])


def generate_with_wrong_version() -> Case:
    """A driver declares version 0 for GENERATE step 3 at staleness 1 (it should be 2)."""
    wrong = queue(_rollout_snap(1, 0), 1, "a", 0, Function.GENERATE, step=3, version=0)
    right = queue(_rollout_snap(1, 2), 1, "a", 0, Function.GENERATE, step=3, version=2)
    return Case(check_decisions(wrong, plan(wrong, 0.0), 0.0),
                check_decisions(right, plan(right, 0.0), 0.0))


# -------------------------------------------------------------------------------- 9 AFFINITY

def dispatch_on_other_group() -> Case:
    """A planner that runs job a's call on an idle group it is not bound to."""
    clus = cluster({"g0": (1, ("n0",)), "g1": (1, ("n0",))}, {"n0": 1e9})
    snap = with_tiers(admitted(clus, trainer_job("a", 50, "g0")), {}, job_tiers={"a": Tier.DEVICE})
    snap = queue(snap, 1, "a", 0, LOGPROBS)
    return _checked(snap, [Dispatch(1, "g1", (key("a", W),))])


def dispatch_on_busy_group() -> Case:
    """A planner that starts a second call on a group while one runs there."""
    snap = admitted(one_group(), trainer_job("a", 50), trainer_job("b", 50, trainable=False))
    snap = with_tiers(snap, {}, job_tiers={"a": Tier.DEVICE, "b": Tier.DEVICE})
    snap = queue(dispatch(queue(snap, 1, "a", 0, LOGPROBS), 1), 2, "b", 0, LOGPROBS)
    return _checked(snap, [Dispatch(2, "g0", (key("b", W),))])


# ---------------------------------------------------------------------------- 10 NODE_CAPACITY

def _pooled_job(job: str, devices: int):
    decl = ModelDecl(Role.POLICY, model(10.0), (Copy.TRAINER,))
    return JobSpec(job=job, models=(decl,), candidates=(),
                   pools=(PoolRequest(Role.POLICY, Copy.TRAINER, devices, "train"),))


def cut_on_a_full_node() -> Case:
    """A planner that cuts a group from devices another group already holds."""
    clus = cluster({}, {"n0": 1e9})                      # one node of 8 devices, no groups
    snap = apply(Snapshot(cluster=clus), ev.JobSubmitted(spec=_pooled_job("a", 6), at=0.0))
    snap = plan_and_assume(snap)
    snap = apply(snap, ev.JobSubmitted(spec=_pooled_job("b", 6), at=0.0))
    group = WorkerGroupSpec("b/policy-trainer", ("n0",), 6, "train", carved=True)
    return _checked(snap, [Place(job="b", role=Role.POLICY, copy=Copy.TRAINER, wg=group.wg, carve=group)])


def cut_twice() -> Case:
    """A planner that cuts a group under an id that exists."""
    clus = cluster({}, {"n0": 1e9, "n1": 1e9})
    snap = apply(Snapshot(cluster=clus), ev.JobSubmitted(spec=_pooled_job("a", 2), at=0.0))
    snap = plan_and_assume(snap)
    snap = apply(snap, ev.JobSubmitted(spec=_pooled_job("b", 2), at=0.0))
    taken = next(iter(snap.cluster.worker_groups))
    group = WorkerGroupSpec(taken, ("n1",), 2, "train", carved=True)
    return _checked(snap, [Place(job="b", role=Role.POLICY, copy=Copy.TRAINER, wg=taken, carve=group)])


def plan_and_assume(snap):
    for decision in plan(snap, 0.0):
        snap = assume(snap, decision, 0.0)
    return snap


BROKEN_PLANNERS: dict[Invariant, list[Callable[[], Case]]] = {
    Invariant.SINGLE_COPY: [move_twice, move_to_own_tier, move_from_stale_tier],
    Invariant.DEVICE_BUDGET: [onload_without_evicting, dispatch_ignoring_workspace],
    Invariant.HOST_BUDGET: [evict_without_spilling],
    Invariant.RESIDENT: [dispatch_before_onload_lands, evict_running_call_state],
    Invariant.ORDER: [dispatch_out_of_order, dispatch_twice],
    Invariant.ISOLATION: [dispatch_with_foreign_state],
    Invariant.VERSION_FORWARD: [stale_sync_installed, eviction_resets_version],
    Invariant.STALENESS: [generate_before_sync, generate_with_wrong_version],
    Invariant.AFFINITY: [dispatch_on_other_group, dispatch_on_busy_group],
    Invariant.NODE_CAPACITY: [cut_on_a_full_node, cut_twice],
}

CASES = [pytest.param(inv, fn, id=f"{inv.name}-{fn.__name__}")
         for inv, fns in BROKEN_PLANNERS.items() for fn in fns]


def test_every_invariant_has_a_broken_planner():
    assert set(BROKEN_PLANNERS) == set(Invariant)
    assert {p.values[0] for p in CASES} == set(Invariant)
    assert all(BROKEN_PLANNERS[inv] for inv in Invariant)


@pytest.mark.parametrize("invariant", list(Invariant), ids=lambda i: i.name)
def test_broken_planner_is_caught_with_its_invariant_named(invariant):
    for broken_planner in BROKEN_PLANNERS[invariant]:
        case = broken_planner()
        assert case.honest == [], f"{broken_planner.__name__}: honest plan flagged: {case.honest}"
        assert case.broken, f"{broken_planner.__name__} was not caught"
        assert {v.invariant for v in case.broken} == {invariant}, case.broken
        for violation in case.broken:
            text = str(violation)
            assert f"invariant {invariant.value} ({invariant.name})" in text
            assert violation.detail in text


@pytest.mark.parametrize("invariant, broken_planner", CASES)
def test_enforce_raises_invariant_error_listing_the_violations(invariant, broken_planner):
    violations = broken_planner().broken
    with pytest.raises(InvariantError) as info:
        enforce(violations)
    err = info.value
    assert isinstance(err, PlexError) and isinstance(err, AssertionError)
    assert err.violations == tuple(violations)
    for violation in violations:
        assert str(violation) in str(err)


def test_enforce_is_silent_without_violations():
    assert enforce([]) is None


def test_invariant_error_lists_several_violations_and_survives_pickling():
    import pickle

    violations = [Violation(Invariant.ORDER, "x before y"), Violation(Invariant.STALENESS, "v3")]
    with pytest.raises(InvariantError) as info:
        enforce(violations)
    text = str(info.value)
    assert "ORDER" in text and "STALENESS" in text and "x before y" in text
    again = pickle.loads(pickle.dumps(info.value))
    assert again.violations == tuple(violations) and str(again) == text
