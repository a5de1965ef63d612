"""HRRS against FCFS on the shipped queue scenarios, at every load point (issue 3's claim).

On queues-mixed and queues-agentic (>= 4 jobs on one training pool, training-call lengths
spanning >= 10x), at each load point of ``[sweep.axes.load]``: HRRS has a lower mean and a
lower p99 call wait on the shared pool than FCFS, and a worst-job slowdown no more than
FCFS's + 10%. Run at ``num_steps=6`` (2 warm-up + 4 measured steps) to keep the module
near a minute. Cells where the claim does not hold are marked ``xfail(strict=True)`` with
the reason measured and explained in docs/design-queues.md (Q5); strict, so a change that
makes one pass shows up.
"""

from __future__ import annotations

from functools import cache

import pytest

from plexrl.sim.queue_study import LoadPoint, load_values, study
from plexrl.sim.scenario import load_scenario

SCENARIOS = ("queues-mixed", "queues-agentic")
OVERRIDES = ("num_steps=6",)

IDENTICAL = ("no two batches meet on the pool at this load, so every policy makes the same "
             "schedule and HRRS cannot be strictly lower (docs/design-queues.md, Q5)")
TAIL = ("the p99 is the largest job's own batch time plus what ran before it; FCFS minimises "
        "the longest flow time on one server, and HRRS lets later, shorter batches pass "
        "(docs/design-queues.md, Q5)")
SAME_TAIL = ("the p99 call is the same call, the largest job's own batch, under both "
             "policies: a tie, not strictly lower (docs/design-queues.md, Q5)")
UNEXPLAINED = "a measured loss of under 2%, not yet explained (docs/design-queues.md, Q5)"
KNOWN = {  # (scenario, think_s, criterion) -> reason, as measured at OVERRIDES
    ("queues-mixed", 5.0, "p99"): TAIL,
    ("queues-agentic", 600.0, "mean"): IDENTICAL,
    ("queues-agentic", 600.0, "p99"): IDENTICAL,
    ("queues-agentic", 240.0, "mean"): IDENTICAL,
    ("queues-agentic", 240.0, "p99"): IDENTICAL,
    ("queues-agentic", 90.0, "mean"): UNEXPLAINED,
    ("queues-agentic", 90.0, "p99"): TAIL,
    ("queues-agentic", 5.0, "p99"): SAME_TAIL,
}


@cache
def points(name: str) -> dict[float, LoadPoint]:
    s = load_scenario(name, OVERRIDES)
    return {p.think_s: p for p in study(s, policies=("fcfs", "hrrs"))}


def cells(criterion: str) -> list:
    out = []
    for name in SCENARIOS:
        for think_s in load_values(load_scenario(name)):
            reason = KNOWN.get((name, think_s, criterion))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            out.append(pytest.param(name, think_s, marks=marks, id=f"{name}-think{think_s:g}"))
    return out


@pytest.mark.parametrize("name, think_s", cells("mean"))
def test_hrrs_has_a_lower_mean_call_wait_than_fcfs(name, think_s):
    p = points(name)[think_s]
    f, h = p.policies["fcfs"], p.policies["hrrs"]
    assert h.mean_wait_s < f.mean_wait_s, (p.offered_load, h.mean_wait_s, f.mean_wait_s)


@pytest.mark.parametrize("name, think_s", cells("p99"))
def test_hrrs_has_a_lower_p99_call_wait_than_fcfs(name, think_s):
    p = points(name)[think_s]
    f, h = p.policies["fcfs"], p.policies["hrrs"]
    assert h.p99_wait_s < f.p99_wait_s, (p.offered_load, h.p99_wait_s, f.p99_wait_s)


@pytest.mark.parametrize("name, think_s", cells("slowdown"))
def test_hrrs_worst_job_slowdown_is_within_fcfs_plus_10_percent(name, think_s):
    p = points(name)[think_s]
    f, h = p.policies["fcfs"], p.policies["hrrs"]
    assert h.worst_slowdown <= 1.1 * f.worst_slowdown, (h.slowdown, f.slowdown)


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_meets_the_study_conditions(name):
    """>= 4 jobs on the pool, call lengths spanning >= 10x, load from light to saturated."""
    s = load_scenario(name, OVERRIDES)
    workloads = next(iter(s.experiments.values())).workloads
    assert len(workloads) >= 4
    pts = points(name)
    fcfs = [c for p in pts.values() for c in [p.policies["fcfs"]]]
    assert all(c.num_calls > 0 for c in fcfs)
    loads = sorted(p.offered_load for p in pts.values())
    assert len(loads) >= 4 and loads[0] < 0.4 and loads[-1] > 0.9, loads
    sizes = [s.workloads[w].prompts_per_step * s.workloads[w].group_size for w in workloads]
    assert max(sizes) >= 10 * min(sizes)
