"""No starvation under HRRS: every queued call is dispatched within the bound of D6.

A tiny fake executor, written here, drives the pure core on one worker group: random jobs
(a trainer copy each, too many to keep all their States on the device, so calls switch)
issue random calls (LOGPROBS, FORWARD_BACKWARD, OPTIM_STEP, in seq order per job) at random
times with random service times; Moves take their nominal transfer time. After every batch
of simultaneous events the loop plans until the core has nothing more to say, as the
simulator does. ``max_wait_s`` is small, so calls go overdue and the overdue path runs.

For every call c, queued at q and runnable from r (its job's previous call dispatched), the
test checks the bound of docs/design.md D6 (restated in docs/design.md, D43:

    dispatch(c) <= max(r, q + max_wait_s) + (Q + 2) x (S_max + X_max)

Q = calls on the group queued before c and not yet dispatched at max(r, q + max_wait_s);
S_max = the longest service time; X_max = the longest switch-in: one round of evictions and
one of onloads, each as long as the longest single transition (Moves of a round run at once).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass

from hypothesis import event, given
from hypothesis import strategies as st

from plexrl.core import apply, assume, plan
from plexrl.core import events as ev
from plexrl.core.costs import transition_s
from plexrl.core.decisions import Dispatch, Move, Place
from plexrl.core.snapshot import CoreConfig, Snapshot
from plexrl.protocol import Function, Tier

from core_builders import BW, one_group, trainer_job

FUNCTIONS = (Function.LOGPROBS, Function.FORWARD_BACKWARD, Function.OPTIM_STEP)
MAX_PLANS_PER_INSTANT = 200


@dataclass
class Issued:
    """One call as the fake driver issues it, and what happened to it."""

    call: int
    job: str
    seq: int
    function: Function
    queued_at: float
    service_s: float
    runnable_at: float | None = None
    dispatched_at: float | None = None


call_spec = st.tuples(st.sampled_from(FUNCTIONS),
                      st.floats(0.0, 30.0, allow_nan=False),        # gap after the previous call
                      st.floats(0.05, 20.0, allow_nan=False))       # service time
job_spec = st.tuples(st.integers(5, 40),                            # params: 90-720 bytes of States
                     st.lists(call_spec, min_size=1, max_size=8))


def run(jobs: list[tuple[int, list]], max_wait_s: float, latency_s: float,
        policy: str) -> tuple[list[Issued], float, float]:
    """Drive the core through every call; returns the calls, S_max and X_max."""
    clus = one_group(host_bytes=1e9, latency_s=latency_s)
    snap = Snapshot(cluster=clus, config=CoreConfig(queue_policy=policy, max_wait_s=max_wait_s))
    heap, order, ids = [], itertools.count(), itertools.count()
    calls: dict[int, Issued] = {}
    for j, (params, specs) in enumerate(jobs):
        snap = apply(snap, ev.JobSubmitted(spec=trainer_job(f"j{j}", params), at=0.0))
        at = 0.0
        for seq, (function, gap, service) in enumerate(specs):
            at += gap
            c = Issued(next(ids), f"j{j}", seq, function, at, service)
            calls[c.call] = c
            heapq.heappush(heap, (at, next(order), ev.CallQueued(call=c.call, job=c.job, seq=seq,
                                                                 function=function, role="policy",
                                                                 at=at)))
    for d in plan(snap, 0.0):
        assert isinstance(d, Place), d
        snap = assume(snap, d, 0.0)
    longest_move = 0.0
    while heap:
        now = heap[0][0]
        while heap and heap[0][0] == now:
            _, _, item = heapq.heappop(heap)
            snap = apply(snap, item)
        for _ in range(MAX_PLANS_PER_INSTANT):
            decisions = plan(snap, now)
            if not decisions:
                break
            for d in decisions:
                snap = assume(snap, d, now)
                if isinstance(d, Dispatch):
                    c = calls[d.call]
                    c.dispatched_at = now
                    nxt = next((o for o in calls.values() if o.job == c.job and o.seq == c.seq + 1), None)
                    if nxt is not None:
                        nxt.runnable_at = max(nxt.queued_at, now)
                    heapq.heappush(heap, (now + c.service_s, next(order), ev.CallFinished(
                        call=c.call, wg=d.wg, at=now + c.service_s, duration_s=c.service_s)))
                elif isinstance(d, Move):
                    seconds = transition_s(clus, d.wg, d.src, d.dst, d.num_bytes, BW)
                    longest_move = max(longest_move, seconds)
                    heapq.heappush(heap, (now + seconds, next(order), ev.TransitionFinished(
                        key=d.key, src=d.src, dst=d.dst, num_bytes=d.num_bytes, at=now + seconds,
                        duration_s=seconds)))
        else:
            raise AssertionError(f"the core kept deciding at t={now}")
    for c in calls.values():
        if c.seq == 0:
            c.runnable_at = c.queued_at
    s_max = max(c.service_s for c in calls.values())
    x_max = 2 * max(longest_move, _largest_move_s(clus, jobs))
    return list(calls.values()), s_max, x_max


def _largest_move_s(clus, jobs) -> float:
    """The nominal time of the largest State's transition (OPTIMIZER, 12 bytes a parameter)."""
    largest = 12 * max(params for params, _ in jobs)
    return max(transition_s(clus, "g0", Tier.HOST, Tier.DEVICE, largest, BW),
               transition_s(clus, "g0", Tier.DEVICE, Tier.HOST, largest, BW))


def bound_s(c: Issued, calls: list[Issued], max_wait_s: float, s_max: float, x_max: float) -> float:
    """D6's latest dispatch time for ``c``."""
    t0 = max(c.runnable_at, c.queued_at + max_wait_s)
    older = [o for o in calls if (o.queued_at, o.call) < (c.queued_at, c.call)
             and o.dispatched_at is not None and o.dispatched_at > t0]
    return t0 + (len(older) + 2) * (s_max + x_max)


@given(jobs=st.lists(job_spec, min_size=1, max_size=4),
       max_wait_s=st.sampled_from([0.5, 2.0, 5.0, 20.0]),
       latency_s=st.sampled_from([0.0, 0.5]))
def test_every_call_is_dispatched_within_the_d6_bound(jobs, max_wait_s, latency_s):
    calls, s_max, x_max = run(jobs, max_wait_s, latency_s, "hrrs")
    assert all(c.dispatched_at is not None for c in calls), "a call was never dispatched"
    overdue = 0
    for c in calls:
        limit = bound_s(c, calls, max_wait_s, s_max, x_max)
        assert c.dispatched_at <= limit + 1e-9, (
            f"call {c.call} of {c.job} (seq {c.seq}, queued {c.queued_at:.2f}, runnable "
            f"{c.runnable_at:.2f}) dispatched at {c.dispatched_at:.2f} > bound {limit:.2f}")
        overdue += c.dispatched_at - c.queued_at > max_wait_s
    event(f"overdue dispatches: {'some' if overdue else 'none'}")


def test_the_overdue_path_is_exercised():
    """A deterministic case where a long non-resident call goes overdue behind short ones."""
    big = (40, [(Function.FORWARD_BACKWARD, 0.0, 10.0)])
    small = [(30, [(Function.LOGPROBS, 0.0, 0.2)] + [(Function.LOGPROBS, 0.1, 0.2)] * 7)
             for _ in range(3)]
    calls, s_max, x_max = run([big, *small], max_wait_s=0.5, latency_s=0.5, policy="hrrs")
    late = [c for c in calls if c.dispatched_at - c.queued_at > 0.5]
    assert late, "no call went overdue: the test does not reach the overdue rule"
    for c in calls:
        assert c.dispatched_at <= bound_s(c, calls, 0.5, s_max, x_max) + 1e-9
