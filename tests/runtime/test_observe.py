"""``observe``: the definitions the metrics and the dashboard share, on hand-made records
and on Snapshots the core's own ledger builds (tests/core/core_builders.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plexrl.protocol import Function
from plexrl.runtime.observe import measures

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
import core_builders as cb  # noqa: E402


def rec(job, queued, start, end, wg="g0"):
    return {"job": job, "wg": wg, "function": "generate", "queued_s": queued, "start_s": start,
            "end_s": end}


def test_interval_union_and_difference():
    assert measures.union_s([(3, 4), (0, 1), (0.5, 2)]) == [(0, 2), (3, 4)]
    assert measures.minus([(0, 4)], [(1, 2), (3, 5)]) == [(0, 1), (2, 3)]


def test_slowdown_counts_only_the_time_a_job_waited_with_nothing_of_it_running():
    calls = [rec("a", 0.0, 0.0, 1.0), rec("b", 0.2, 1.0, 1.5), rec("a", 1.1, 1.5, 2.0)]
    slow = measures.slowdowns(calls, (), (), now=3.0, live={"a"})
    assert slow["b"] == pytest.approx({"elapsed_s": 1.3, "blocked_s": 0.8, "slowdown": 1.3 / 0.5,
                                       "num_calls": 1})
    assert slow["a"] == pytest.approx({"elapsed_s": 3.0, "blocked_s": 0.4, "slowdown": 3.0 / 2.6,
                                       "num_calls": 2})


def test_saving_compares_held_device_seconds_with_each_job_alone_for_its_unblocked_time():
    calls = [rec("a", 0.0, 0.0, 1.0), rec("b", 0.0, 1.0, 2.0)]
    slow = measures.slowdowns(calls, (), (), now=2.0, live=set())
    got = measures.saving(calls, slow, {"g0": 2}, now=2.0)
    assert got == pytest.approx({"shared_device_s": 4.0, "isolated_device_s": 2 * (1 + 1),
                                 "saving_frac": 0.0})
    idle = calls + [rec("a", 3.0, 3.0, 4.0)]   # a waits 2 s on its driver: held, not blocked
    slow = measures.slowdowns(idle, (), (), now=4.0, live=set())
    assert measures.saving(idle, slow, {"g0": 1}, now=4.0)["saving_frac"] == pytest.approx(
        1 - 4.0 / (4.0 + 1.0))


def test_switches_and_utilisation():
    calls = [rec("a", 0, 0, 1), rec("b", 0, 1, 2), rec("b", 0, 2, 3), rec("a", 0, 3, 4),
             rec("c", 0, 0, 4, wg="g1")]
    assert measures.switches(calls) == {"g0": 2, "g1": 0}
    assert measures.busy_s(calls[:2], since=0.5, until=3.0) == pytest.approx(1.5)
    assert measures.busy_s([], since=0.0, until=3.0, running_since=2.0) == pytest.approx(1.0)


def test_a_queued_call_says_why_it_waits():
    snap = cb.admitted(cb.one_group(), cb.rollout_job("a", 10), cb.rollout_job("b", 10))
    snap = cb.queue(snap, 1, "a", 0, Function.GENERATE)
    snap = cb.queue(snap, 2, "b", 1, Function.GENERATE)      # b's call #0 has not come
    snap = cb.queue(snap, 3, "b", 0, Function.GENERATE)
    snap = cb.dispatch(snap, 1)
    assert measures.wait_reason(snap, cb.call_view(snap, 2)) == "after its job's call #0 on policy/rollout"
    assert measures.wait_reason(snap, cb.call_view(snap, 3)) == "group busy: a generate"


class Live:
    """The fields of a queued or running CallView that ``Tally.slowdowns`` reads."""

    def __init__(self, c):
        self.job, self.queued_at, self.started_at = c["job"], c["queued_s"], c["start_s"]


@st.composite
def shared_runs(draw):
    """Calls of jobs a and b on one group, one at a time, each job's calls in order."""
    calls, t, ready = [], 0.0, {"a": 0.0, "b": 0.0}
    for _ in range(draw(st.integers(1, 10))):
        job = draw(st.sampled_from("ab"))
        queued = ready[job] + draw(st.floats(0, 1))
        start = max(t, queued) + draw(st.floats(0, 0.5))
        t = start + draw(st.floats(0.01, 1))
        ready[job] = t
        calls.append(rec(job, queued, start, t))
    return calls


@given(shared_runs(), st.lists(st.floats(0, 12), max_size=6))
def test_the_running_tally_reads_each_record_once_and_agrees_with_a_fresh_one(calls, times):
    tally, log = measures.Tally(), sorted(calls, key=lambda c: c["end_s"])
    for now in sorted(times) + [log[-1]["end_s"] + 1]:
        done = [c for c in log if c["end_s"] <= now]
        running = [Live(c) for c in log if c["start_s"] <= now < c["end_s"]]
        queued = [Live(c) for c in log if c["queued_s"] <= now < c["start_s"]]
        tally.update(done)
        got = tally.slowdowns(running, queued, now, live={"a", "b"})
        fresh = measures.slowdowns(done, running, queued, now, live={"a", "b"})
        assert got.keys() == fresh.keys()
        for job in got:
            assert got[job] == pytest.approx(fresh[job], abs=1e-9), job
