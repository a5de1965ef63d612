"""HRRS weighted by job priority (docs/design.md): the weight multiplies the ratio,
and ``stable_until`` stays a true bound with weights."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plexrl.core.queues import Candidate, HrrsQueue, priority_weight, ratio
from plexrl.core.snapshot import CallView
from plexrl.protocol import Function


def cand(call: int, job: str, queued_at: float, service_s: float, switch_s: float, now: float,
         priority: int = 0) -> Candidate:
    view = CallView(call=call, job=job, seq=0, function=Function.LOGPROBS, role="policy",
                    wg="g0", queued_at=queued_at)
    return Candidate(view, now - queued_at, service_s, switch_s, priority_weight(priority))


def test_priority_weight_is_one_at_zero_and_grows_with_priority():
    assert priority_weight(0) == 1.0
    assert priority_weight(1) == 2.0 and priority_weight(-1) == 0.5
    weights = [priority_weight(p) for p in range(-5, 6)]
    assert weights == sorted(weights) and len(set(weights)) == len(weights)


def test_weight_multiplies_the_ratio():
    plain = cand(1, "a", 0.0, 2.0, 1.0, now=10.0)
    weighted = cand(1, "a", 0.0, 2.0, 1.0, now=10.0, priority=3)
    assert ratio(weighted) == pytest.approx(4 * ratio(plain))


def test_a_higher_priority_job_wins_a_tie_and_an_older_rival_of_lower_priority():
    hrrs = HrrsQueue()
    low, high = cand(1, "low", 0.0, 1.0, 0.0, 10.0), cand(2, "high", 0.0, 1.0, 0.0, 10.0, 1)
    assert hrrs.pick([low, high], None, 600.0).call.job == "high"
    older = cand(1, "low", -5.0, 1.0, 0.0, 10.0)      # ratio 16 against 2 * 11 = 22
    assert hrrs.pick([older, high], None, 600.0).call.job == "high"
    oldest = cand(1, "low", -20.0, 1.0, 0.0, 10.0)    # ratio 31 against 22: waiting still wins
    assert hrrs.pick([oldest, high], None, 600.0).call.job == "low"


def test_overdue_calls_go_first_whatever_their_priority():
    hrrs = HrrsQueue()
    overdue = cand(1, "low", 0.0, 1.0, 0.0, 700.0, priority=-3)
    fresh = cand(2, "high", 699.0, 1.0, 0.0, 700.0, priority=9)
    assert hrrs.pick([overdue, fresh], None, 600.0).call.job == "low"


calls = st.tuples(st.floats(0.0, 50.0), st.floats(0.01, 20.0), st.floats(0.0, 20.0),
                  st.integers(-3, 6))


@given(st.lists(calls, min_size=2, max_size=5), st.floats(0.0, 200.0))
def test_stable_until_bounds_the_weighted_pick(rows, later):
    """Before ``stable_until`` the weighted pick never turns to a rival (waits grow alike)."""
    hrrs, now = HrrsQueue(), 60.0
    def at(t):
        return [cand(i, f"j{i}", q, s, x, t, p) for i, (q, s, x, p) in enumerate(rows)]
    candidates = at(now)
    picked = hrrs.pick(candidates, None, 1e9)
    rivals = [c for c in candidates if c is not picked]
    until = hrrs.stable_until(candidates, picked, rivals, None, now, 1e9)
    t = now + later
    if t < until and math.isfinite(t):
        assert hrrs.pick(at(t), None, 1e9).call.call == picked.call.call
