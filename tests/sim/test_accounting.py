"""Fair accounting (``plexrl.sim.experiments.accounting``): every allocated GPU-second is charged once.

Unit tests on hand-built traces pin down how a group's seconds are split (by held time, an
idle window evenly, only the part of a call inside the window); the simulated modes of
tests/data/tiny-e2e.toml check that charges add up to allocations in every mode, and that
the baselines (each job on pools of its own) run each job exactly as fast as alone.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from plexrl.protocol import Function, JobId, WorkerGroupId
from plexrl.sim.experiments.accounting import Window, charge, measurement_window, steps_in
from plexrl.sim.experiments.experiment import fixed_sizes, run_mode
from plexrl.sim.experiments.loop import CallRecord, Trace
from plexrl.sim.scenario import MODES, load_scenario

TINY = Path(__file__).resolve().parents[1] / "data" / "tiny-e2e.toml"
A, B = JobId("a"), JobId("b")
G, H = WorkerGroupId("g"), WorkerGroupId("h")
BASELINES = ("colocated", "split-async")


def call(wg, job, start, end, useful=0.0, function=Function.FORWARD_BACKWARD) -> CallRecord:
    return CallRecord(wg, job, function, 0, float(start), float(end), float(useful))


STEPS = {A: [0.0, 10.0, 20.0, 30.0], B: [0.0, 10.0, 20.0, 30.0]}


# --- charge on hand-built traces -----------------------------------------------------------

def test_two_jobs_on_one_group_split_by_held_time():
    # 4 GPUs for 10 s = 40 GPU-s; a holds 6 s, b 2 s, 2 s idle: split 6:2 over the 40.
    trace = Trace(calls=[call(G, A, 0, 6, useful=12), call(G, B, 6, 8, useful=4)])
    c = charge(trace, {G: 4}, {G: [A, B]}, STEPS, Window(0.0, 10.0))
    assert c.allocated == {G: 40.0}
    assert c.charged[A] == pytest.approx(30.0) and c.charged[B] == pytest.approx(10.0)
    assert sum(c.charged.values()) == pytest.approx(sum(c.allocated.values()))
    assert c.useful == {A: pytest.approx(12.0), B: pytest.approx(4.0)}


def test_idle_group_is_split_evenly():
    # No call of either job overlaps [10, 20] on g: its 80 GPU-s are split evenly.
    trace = Trace(calls=[call(G, A, 0, 5), call(G, B, 25, 30)])
    c = charge(trace, {G: 8}, {G: [A, B]}, STEPS, Window(10.0, 20.0))
    assert c.charged == {A: pytest.approx(40.0), B: pytest.approx(40.0)}
    assert c.useful == {A: 0.0, B: 0.0}


def test_call_straddling_the_window_counts_only_inside():
    # Window [10, 20]. a: [5, 16] holds 6 s inside (of 11); b: [16, 24] holds 4 s inside.
    trace = Trace(calls=[call(G, A, 5, 16, useful=22), call(G, B, 16, 24, useful=16)])
    c = charge(trace, {G: 2}, {G: [A, B]}, STEPS, Window(10.0, 20.0))
    assert c.charged[A] == pytest.approx(20 * 6 / 10) and c.charged[B] == pytest.approx(20 * 4 / 10)
    assert c.useful[A] == pytest.approx(22 * 6 / 11) and c.useful[B] == pytest.approx(16 * 4 / 8)


def test_charges_add_over_groups_and_private_pools_go_to_their_job():
    # g is shared (a 3 s, b 1 s held), h is a's alone (idle: all of it still a's).
    trace = Trace(calls=[call(G, A, 0, 3), call(G, B, 3, 4)])
    c = charge(trace, {G: 4, H: 2}, {G: [A, B], H: [A]}, STEPS, Window(0.0, 10.0))
    assert c.allocated == {G: 40.0, H: 20.0}
    assert c.charged == {A: pytest.approx(30.0 + 20.0), B: pytest.approx(10.0)}
    assert c.steps == {A: pytest.approx(1.0), B: pytest.approx(1.0)}


def test_zero_length_call_is_harmless():
    trace = Trace(calls=[call(G, A, 5, 5, useful=3), call(G, B, 2, 4, useful=2)])
    c = charge(trace, {G: 1}, {G: [A, B]}, STEPS, Window(0.0, 10.0))
    assert c.charged == {A: 0.0, B: pytest.approx(10.0)}
    assert c.useful == {A: 0.0, B: pytest.approx(2.0)}


# --- steps_in and measurement_window -------------------------------------------------------

@pytest.mark.parametrize("start,end,expected", [
    (10.0, 40.0, 3.0),    # on step ends
    (15.0, 35.0, 2.0),    # halfway between ends on both sides
    (25.0, 30.0, 0.5),
    (12.0, 13.0, 0.1),
    (20.0, 20.0, 0.0),
])
def test_steps_in_interpolates_between_step_ends(start, end, expected):
    assert steps_in([10.0, 20.0, 30.0, 40.0], Window(start, end)) == pytest.approx(expected)


def test_steps_in_uneven_steps():
    # steps end at 10, 30 (a 20 s step), 35 (a 5 s step): [20, 35] holds 1/2 + 1 steps.
    assert steps_in([10.0, 30.0, 35.0], Window(20.0, 35.0)) == pytest.approx(1.5)


def test_measurement_window_after_every_warmup_before_any_end():
    ends = {A: [1.0, 5.0, 9.0, 13.0], B: [2.0, 6.0, 10.0, 14.0]}
    w = measurement_window(ends, 2)
    assert (w.start_s, w.end_s, w.length_s) == (6.0, 13.0, 7.0)
    w1 = measurement_window(ends, 1)
    assert (w1.start_s, w1.end_s) == (2.0, 13.0)


@pytest.mark.parametrize("ends", [
    {A: [1.0, 2.0, 3.0, 4.0], B: [10.0, 11.0, 12.0, 13.0]},   # a ends before b warms up
    {A: [1.0, 2.0, 3.0, 4.0], B: [4.0, 5.0, 6.0, 7.0]},       # touching: empty window
])
def test_measurement_window_raises_without_overlap(ends):
    with pytest.raises(ValueError, match="overlap"):
        measurement_window(ends, 1)


# --- simulated modes -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny():
    return load_scenario(str(TINY))


def _experiment_modes():
    s = load_scenario(str(TINY))
    return [(name, mode) for name in s.experiments for mode in s.modes]


@pytest.mark.parametrize("experiment,mode", _experiment_modes())
def test_charged_equals_allocated_in_every_mode(tiny, experiment, mode):
    workloads = tiny.experiments[experiment].workloads
    table = tiny.sizes[tiny.workloads[workloads[0]].model]
    result = run_mode(tiny, mode, workloads, fixed_sizes(table), tiny.seed, with_alone=False)
    assert result.allocated_gpu_s > 0
    assert math.isclose(result.charged_gpu_s, result.allocated_gpu_s, rel_tol=1e-6), (
        result.charged_gpu_s, result.allocated_gpu_s)
    for job, r in result.jobs.items():
        assert r.gpu_hours_per_step > 0 and 0 <= r.bubble_frac < 1, (job, r)
        assert r.useful_gpu_hours_per_step <= r.gpu_hours_per_step * (1 + 1e-9), (job, r)


def test_every_mode_is_covered(tiny):
    assert tuple(tiny.modes) == MODES


@pytest.mark.parametrize("experiment", ["7b-identical", "235b-identical", "7b-mixed"])
@pytest.mark.parametrize("mode", BASELINES)
def test_baseline_jobs_run_as_fast_as_alone(tiny, experiment, mode):
    workloads = tiny.experiments[experiment].workloads
    table = tiny.sizes[tiny.workloads[workloads[0]].model]
    result = run_mode(tiny, mode, workloads, fixed_sizes(table), tiny.seed, with_alone=True)
    assert len(result.jobs) == 2
    for job, r in result.jobs.items():
        assert r.slowdown == pytest.approx(1.0, abs=1e-9), (job, r.slowdown)
