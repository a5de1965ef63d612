"""HRRS against FCFS on the shipped queue scenarios, at every load point (issue 3's claim).

On queues-mixed and queues-agentic (>= 4 jobs on one training pool, training-call lengths
spanning >= 10x), at each load point of ``[sweep.axes.load]``: HRRS has a lower mean and a
lower p99 ready wait (start - when the call became runnable; docs/design.md, D46 on
the shared pool than FCFS, and a worst-job slowdown no more than FCFS's + 10%. Run as
shipped (10 steps: 2 warm-up + 8 measured, >= 100 calls per run), each cell over the
scenario's ``[sweep] seeds`` seeds: calls pooled for the mean and p99, the worst slowdown
over the seeds (D52). Cells where the claim does not hold are marked ``xfail(strict=True)``
with the numbers measured and the reason (docs/design.md, D52; strict, so a change
that makes one pass shows up.
"""

from __future__ import annotations

from functools import cache

import pytest

from plexrl.sim.experiments.queue_study import LoadPoint, load_values, seeds, study
from plexrl.sim.scenario import load_scenario

SCENARIOS = ("queues-mixed", "queues-agentic")

KNOWN = {  # (scenario, think_s, criterion) -> reason, as measured (docs/design.md, D52)
    ("queues-mixed", 150.0, "mean"):
        "offered load 0.83, seeds 0-2 pooled: HRRS mean ready wait 6.07 s vs FCFS 5.42 s. One "
        "trajectory decides it: seed 1 HRRS 7.58 vs FCFS 5.29 s, where the two 256-prompt "
        "jobs' summed ready waits double (84/118 -> 179/184 s; a LOGPROBS of each waits 57 s); seeds 0, 2, 3, 4 "
        "are lower under HRRS (5.44/5.52, 5.20/5.45, 5.32/5.35, 5.19/5.61 s) (D52)",
}


@cache
def points(name: str) -> dict[float, LoadPoint]:
    return {p.think_s: p for p in study(load_scenario(name), policies=("fcfs", "hrrs"))}


def cells(criterion: str) -> list:
    out = []
    for name in SCENARIOS:
        for think_s in load_values(load_scenario(name)):
            reason = KNOWN.get((name, think_s, criterion))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            out.append(pytest.param(name, think_s, marks=marks, id=f"{name}-think{think_s:g}"))
    return out


@pytest.mark.parametrize("name, think_s", cells("mean"))
def test_hrrs_has_a_lower_mean_ready_wait_than_fcfs(name, think_s):
    p = points(name)[think_s]
    f, h = p.policies["fcfs"].waits, p.policies["hrrs"].waits
    assert h.mean_ready_s < f.mean_ready_s, (p.offered_load, h.mean_ready_s, f.mean_ready_s)


@pytest.mark.parametrize("name, think_s", cells("p99"))
def test_hrrs_has_a_lower_p99_ready_wait_than_fcfs(name, think_s):
    p = points(name)[think_s]
    f, h = p.policies["fcfs"].waits, p.policies["hrrs"].waits
    assert h.p99_ready_s < f.p99_ready_s, (p.offered_load, h.p99_ready_s, f.p99_ready_s)


@pytest.mark.parametrize("name, think_s", cells("slowdown"))
def test_hrrs_worst_job_slowdown_is_within_fcfs_plus_10_percent(name, think_s):
    p = points(name)[think_s]
    f, h = p.policies["fcfs"], p.policies["hrrs"]
    assert h.worst_slowdown <= 1.1 * f.worst_slowdown, (h.slowdown, f.slowdown)


@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_meets_the_study_conditions(name):
    """>= 4 jobs on the pool, call lengths spanning >= 10x, >= 100 measured calls per seed,
    >= 3 seeds, >= 4 load points from light to saturated, and at every point the jobs' calls meet on the pool
    and the two policies make different schedules, so "lower" is measurable (D47)."""
    s = load_scenario(name)
    workloads = next(iter(s.experiments.values())).workloads
    assert len(workloads) >= 4
    sizes = [s.workloads[w].prompts_per_step * s.workloads[w].group_size for w in workloads]
    assert max(sizes) >= 10 * min(sizes)
    assert len(seeds(s)) >= 3
    pts = points(name)
    loads = sorted(p.offered_load for p in pts.values())
    assert len(loads) >= 4 and loads[0] < 0.6 and loads[-1] > 0.9, loads
    for p in pts.values():
        f, h = p.policies["fcfs"].waits, p.policies["hrrs"].waits
        assert f.num_calls >= 100 * len(seeds(s)) and f.num_calls == h.num_calls
        assert f.contended > 0, p.think_s
        assert f != h, f"the policies made the same schedule at think {p.think_s:g} s"
        assert f.mean_ready_s <= f.mean_wait_s and h.mean_ready_s <= h.mean_wait_s
