"""The incremental planner decides exactly what a full re-plan of every group decides.

``plan`` skips the worker groups its memo (``Snapshot.quiet_groups``) knows to be quiet, and
the ledger's folds carry that memo and the derived indexes to the next Snapshot by rule
(``core.carry``; docs/design.md). On the random worlds and event sequences of
test_planner_properties (hypothesis), every plan is compared with a full re-plan on a copy
of the Snapshot that carries nothing; every group the memo calls quiet must plan to nothing
there, now and later inside its window; every carried index must equal the one computed
afresh; and each fold's rule-based Delta must cover what a comparison of the two Snapshots
finds changed. Then hand-built cases: which groups a change dirties, HRRS windows, and
assuming a decision once.
"""

from __future__ import annotations

import math
from collections import Counter
from contextlib import contextmanager
from dataclasses import replace
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import test_planner_properties as props
from core_builders import admitted, cluster, key, queue, rl_job, trainer_job, with_tiers
from plexrl.core import apply, assume, plan
from plexrl.core import events as ev
from plexrl.core.carry import delta_of, diff, touched
from plexrl.core.decisions import Move
from plexrl.core.planner import _plan_group
from plexrl.core.queues import Candidate, queue_by_name
from plexrl.core.snapshot import ALWAYS, CallView, CoreConfig, Snapshot
from plexrl.protocol import Function, State, Tier

DERIVED = ("states_by_group", "queued_by_group", "device_state_bytes", "host_state_bytes",
           "num_bound_jobs")
LATER_S = (0.0, 0.5, 30.0, 700.0)   #: how far ahead a quiet group is re-planned to check it


def fresh(snap: Snapshot) -> Snapshot:
    """The same Snapshot with nothing derived, memoised or carried: a full re-plan."""
    return replace(snap)


# ------------------------------------------------------------------------------ the checks

class Checks:
    """Wraps the fake driver's ``apply``/``assume``/``plan`` with the comparisons above."""

    def __init__(self):
        self.seen: Counter = Counter()

    def apply(self, snap, event):
        new = apply(snap, event)
        self.fold_checks(snap, new, event)
        return new

    def assume(self, snap, decision, now):
        new = assume(snap, decision, now)
        self.fold_checks(snap, new, decision)
        return new

    def plan(self, snap, now):
        full = plan(fresh(snap), now)
        got = plan(snap, now)
        assert got == full
        self.memo_checks(snap, now)
        self.index_checks(snap)
        return got

    def fold_checks(self, old, new, change) -> None:
        rule, truth = delta_of(old, new, change), diff(old, new)
        assert set(rule.states) == set(truth.states), change
        assert {c.call for c in rule.calls_added} == {c.call for c in truth.calls_added}
        assert {c.call for c in rule.calls_removed} == {c.call for c in truth.calls_removed}
        assert set(rule.rebound) == set(truth.rebound), change
        assert touched(old, new, rule) >= touched(old, new, truth), change
        self.index_checks(new)

    def index_checks(self, snap) -> None:
        base = fresh(snap)
        for name in DERIVED:
            if name in snap.__dict__:
                assert snap.__dict__[name] == getattr(base, name), name
                self.seen[f"carried:{name}"] += 1

    def memo_checks(self, snap, now) -> None:
        """Each group the memo calls quiet plans to nothing on a fresh copy, in its window."""
        memo, base = snap.quiet_groups, fresh(snap)
        for wg in snap.group_order:
            if wg in memo.unknown:
                continue
            since, until = memo.windows.get(wg, ALWAYS)
            self.seen["quiet:window" if until < math.inf else "quiet:always"] += 1
            times = {now + s for s in LATER_S} | ({math.nextafter(until, -math.inf)}
                                                   if until < math.inf else set())
            for t in sorted(times):
                if since <= t < until:
                    assert _plan_group(base, wg, t) == [], (wg, t, since, until)
                else:
                    self.seen["window:lapsed"] += 1
        self.seen["skipped"] += len(snap.group_order) - len(memo.to_plan(now))


@contextmanager
def checking():
    checks = Checks()
    with mock.patch.object(props, "apply", checks.apply), \
            mock.patch.object(props, "assume", checks.assume), \
            mock.patch.object(props, "plan", checks.plan):
        yield checks


# ------------------------------------------------------------------------------ properties

@pytest.mark.parametrize("policy", props.POLICIES)
@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_incremental_plans_equal_full_replans_on_random_event_sequences(policy, data):
    mode = data.draw(st.sampled_from(list(props.MODES.values())))
    config = CoreConfig(queue_policy=policy, **mode,
                        max_wait_s=data.draw(st.sampled_from([5.0, 600.0])))
    ch = props.DataChooser(data)
    with checking():
        props.drive(ch, config, num_actions=ch.integer(1, 120))


def test_the_random_runs_exercise_the_memo():
    """Not vacuous: groups are skipped, windows are recorded and lapse, indexes carried."""
    seen: Counter = Counter()
    for seed in range(10):
        for policy in props.POLICIES:
            with checking() as checks:
                props.drive(props.Chooser(seed), CoreConfig(queue_policy=policy,
                                                            max_wait_s=30.0), num_actions=150)
            seen += checks.seen
    for what in ("skipped", "quiet:always", "quiet:window", "window:lapsed",
                 *(f"carried:{name}" for name in DERIVED)):
        assert seen[what] > 0, (what, seen)


# ------------------------------------------------------------------------- dirty groups

def three_groups() -> Snapshot:
    """g0 and g1 share node n0 (and its host memory); g2 is alone on n1. Job a trains on g0,
    b on g1, c on g2; every group has planned and is quiet."""
    clus = cluster({"g0": (1, ("n0",)), "g1": (1, ("n0",)), "g2": (1, ("n1",))},
                   {"n0": 1e6, "n1": 1e6})
    snap = admitted(clus, trainer_job("a", 10, "g0"), trainer_job("b", 10, "g1"),
                    trainer_job("c", 10, "g2"))
    assert plan(snap, 0.0) == []
    assert snap.quiet_groups.to_plan(0.0) == []
    return snap


def test_a_queued_call_dirties_only_its_group():
    snap = queue(three_groups(), 1, "c", 0, Function.LOGPROBS)
    assert snap.quiet_groups.to_plan(0.0) == ["g2"]


def test_a_finished_transition_dirties_every_group_sharing_its_node():
    snap = three_groups()
    move = Move(key("a", State.WEIGHTS), Tier.HOST, Tier.DEVICE, 20, "g0", "onload")
    snap = assume(snap, move, 0.0)
    assert snap.quiet_groups.to_plan(0.0) == ["g0", "g1"]
    assert plan(snap, 0.0) == []
    snap = apply(snap, ev.TransitionFinished(move.key, Tier.HOST, Tier.DEVICE, 20, 1.0, 1.0))
    assert snap.quiet_groups.to_plan(1.0) == ["g0", "g1"]


def test_a_snapshot_built_by_hand_plans_every_group():
    snap = three_groups()
    rebuilt = with_tiers(snap, {key("c", State.GRADS): Tier.DISK})
    assert rebuilt.quiet_groups.to_plan(0.0) == ["g0", "g1", "g2"]


def test_a_decision_is_assumed_once():
    snap = queue(three_groups(), 1, "a", 0, Function.LOGPROBS)
    (decision,) = plan(snap, 0.0)
    assert assume(snap, decision, 0.0) is assume(snap, decision, 0.0)


def test_a_quiet_window_lapses_when_hrrs_could_pick_a_call_that_acts():
    """Job c's call runs on g0. Next in line: b's long LOGPROBS (its States resident: picking
    it does nothing) and a's short FORWARD_BACKWARD (parked: picking it prefetches). HRRS
    picks b's now; a's ratio rises faster and overtakes it, so the group is quiet only until
    then, and planned again after: it prefetches."""
    clus = cluster({"g0": (1, ("n0",))}, {"n0": 1e6})
    snap = admitted(clus, rl_job("a", 10, "g0", "g0"), trainer_job("b", 10, "g0"),
                    trainer_job("c", 10, "g0"))
    snap = with_tiers(snap, {}, job_tiers={"b": Tier.DEVICE, "c": Tier.DEVICE})
    snap = queue(snap, 1, "c", 0, Function.LOGPROBS)
    (dispatch,) = plan(snap, 0.0)
    snap = assume(snap, dispatch, 0.0)
    snap = queue(snap, 2, "b", 0, Function.LOGPROBS, num_tokens=10**6)
    snap = queue(snap, 3, "a", 0, Function.FORWARD_BACKWARD, num_tokens=1)
    assert plan(snap, 0.0) == []
    since, until = snap.quiet_groups.windows["g0"]
    assert since == 0.0 and 0.0 < until < 600.0   # a crossing, before any call is overdue
    assert snap.quiet_groups.to_plan(until) == ["g0"]
    later = until * 1.01 + 1.0
    moves = plan(snap, later)
    assert moves == plan(fresh(snap), later) != []
    assert {(m.key.job, m.reason) for m in moves} == {("a", "prefetch")}


# ------------------------------------------------------------------------------ HRRS windows

def cand(call: int, queued_at: float, service_s: float, switch_s: float, now: float):
    view = CallView(call=call, job=f"j{call % 2}", seq=0, function=Function.LOGPROBS,
                    role="policy", wg="g0", queued_at=queued_at)
    return Candidate(view, now - queued_at, service_s, switch_s)


def at(candidates: list[Candidate], t: float) -> list[Candidate]:
    return [replace(c, wait_s=t - c.call.queued_at) for c in candidates]


def test_hrrs_window_ends_where_a_rival_overtakes():
    # long call waiting since 0 (ratio (t + 30) / 30) vs a short one queued at 99 ((t - 98) / 1)
    now = 100.0
    picked, rival = cand(1, 0.0, 30.0, 0.0, now), cand(2, 99.0, 1.0, 0.0, now)
    hrrs = queue_by_name("hrrs")
    assert hrrs.pick([picked, rival], None, 600.0) == picked
    until = hrrs.stable_until([picked, rival], picked, [rival], None, now, 600.0)
    assert until == pytest.approx(99 * 30 / 29, rel=1e-9)
    assert hrrs.pick(at([picked, rival], until + 1e-6), None, 600.0).call.call == 2
    # a short call ahead now stays ahead: its ratio rises faster; overdue calls cut windows
    short = cand(3, 90.0, 1.0, 0.0, now)
    assert hrrs.pick([picked, short], None, 600.0) == short
    assert hrrs.stable_until([picked, short], short, [picked], None, now, math.inf) == math.inf
    assert hrrs.stable_until([picked, short], short, [picked], None, now, 600.0) == \
        pytest.approx(0.0 + 600.0, rel=1e-9)   # when the long call would be overdue
    assert hrrs.stable_until([picked, short], short, [picked], None, now, 600.0) < 600.0
    # an overdue pick stays picked: calls overdue later arrived later
    assert hrrs.pick([picked, rival], None, 50.0) == picked
    assert hrrs.stable_until([picked, rival], picked, [rival], None, now, 50.0) == math.inf
    for name in ("fcfs", "round-robin"):
        assert queue_by_name(name).stable_until([picked, rival], picked, [rival], None, now,
                                                600.0) == math.inf


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.floats(0, 1000), st.floats(0, 100), st.floats(0, 100)),
                min_size=2, max_size=4),
       st.floats(0, 1), st.sampled_from([5.0, 600.0]), st.sampled_from([None, "j0", "j1"]),
       st.data())
def test_hrrs_picks_no_rival_inside_its_window(rows, frac, max_wait_s, last_job, data):
    now = 1000.0
    cands = [cand(i, q, s, x, now) for i, (q, s, x) in enumerate(rows)]
    hrrs = queue_by_name("hrrs")
    picked = hrrs.pick(cands, last_job, max_wait_s)
    others = [c for c in cands if c is not picked]
    rivals = data.draw(st.lists(st.sampled_from(others), unique_by=lambda c: c.call.call,
                                min_size=1))
    until = hrrs.stable_until(cands, picked, rivals, last_job, now, max_wait_s)
    assert until >= now
    span = min(until, now + 1e6) - now
    for t in (now, now + frac * span, now + span * (1 - 1e-9)):
        if t < until:
            assert hrrs.pick(at(cands, t), last_job, max_wait_s).call.call not in \
                {r.call.call for r in rivals}
