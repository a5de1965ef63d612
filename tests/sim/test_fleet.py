"""The rollout-fleet modes (D203): every job's batch split over lanes on fleet groups that
serve several jobs, with the core's invariants checked at every step of the simulation."""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import pytest

from plexrl.protocol import Function
from plexrl.sim.experiments.experiment import fixed_sizes, run_mode, simulate
from plexrl.sim.experiments.modes import FLEET_MODES, build_layout
from plexrl.sim.scenario import load_scenario

TINY = Path(__file__).resolve().parents[1] / "data" / "tiny-e2e.toml"


@pytest.fixture(scope="module")
def tiny():
    return load_scenario(str(TINY), ())


def _layout(s, mode, tenants):
    workloads = s.experiments["7b-identical"].workloads
    sizes = replace(fixed_sizes(s.sizes["qwen7b"]), fleet_tenants=tenants)
    return build_layout(s, mode, workloads, sizes, seed=0)


@pytest.mark.parametrize("mode", FLEET_MODES)
def test_each_step_is_split_over_the_jobs_lanes_and_fleet_groups_serve_several_jobs(tiny, mode):
    layout = _layout(tiny, mode, tenants=0)            # every job on every group
    trace = simulate(tiny, layout)                     # invariants checked at every fold
    fleet = [wg for wg in layout.cluster.worker_groups if wg.startswith("fleet")]
    assert len(fleet) >= 2
    chunks: dict[tuple, list] = defaultdict(list)
    served = defaultdict(set)
    for c in trace.calls:
        if c.function == Function.GENERATE:
            chunks[(c.job, c.step)].append(c)
            served[c.wg].add(c.job)
    for (job, step), calls in chunks.items():
        sim_job = layout.jobs[job]
        if step >= sim_job.trained:                     # the run ended during this rollout
            continue
        assert len(calls) == sim_job.lanes == len(fleet)
        assert {c.wg for c in calls} == set(fleet)     # one chunk on each group
        assert sum(len(sim_job.chunk(step, lane)) for lane in range(sim_job.lanes)) == \
            sim_job.batch_size
    assert all(served[wg] == set(layout.jobs) for wg in fleet)


def test_one_tenant_per_group_keeps_each_jobs_lanes_apart(tiny):
    layout = _layout(tiny, "plexrl-shared", tenants=1)
    trace = simulate(tiny, layout)
    jobs_on = defaultdict(set)
    for c in trace.calls:
        if c.function == Function.GENERATE:
            jobs_on[c.wg].add(c.job)
    assert all(len(jobs) == 1 for jobs in jobs_on.values())       # no group is shared
    per_job = Counter(next(iter(jobs)) for jobs in jobs_on.values())
    assert set(per_job) == set(layout.jobs)
    assert all(n == layout.jobs[job].lanes for job, n in per_job.items())


def test_the_fleet_sizes_are_reported_as_run(tiny):
    workloads = tiny.experiments["7b-identical"].workloads
    result = run_mode(tiny, "plexrl-shared-on-policy", workloads, fixed_sizes(tiny.sizes["qwen7b"]),
                      seed=0, with_alone=False)
    group = tiny.models["qwen7b"].rollout_tp
    assert result.sizes["fleet_group_gpus"] == group and result.sizes["fleet_tenants"] == 2
    assert all(r.gpu_hours_per_step > r.useful_gpu_hours_per_step > 0 for r in result.jobs.values())


def test_a_shared_training_pool_that_fits_no_replica_is_refused_naming_its_field():
    from plexrl.errors import ConfigError
    from plexrl.sim.experiments.preflight import preflight
    bad = load_scenario(str(TINY), ("sizes.qwen7b.shared_train_choices=[4]",))
    with pytest.raises(ConfigError, match="does not divide into trainer instances") as err:
        preflight(bad)
    assert "sizes.qwen7b.shared_train_choices" in str(err.value)


def test_the_search_moves_to_the_next_cheapest_size_when_a_job_is_slowed_past_the_bound(tiny):
    """``max_slowdown`` (D208): the cheapest size is kept only if every job is within the
    bound; set just below its worst slowdown, the search takes a dearer size that is within
    it, or, if none is, the one whose worst job is slowed least."""
    from plexrl.sim.experiments.experiment import (search, tried_sizes, with_slowdowns,
                                                   worst_slowdown)
    workloads = tiny.experiments["235b-identical"].workloads
    free = search(tiny, "plexrl-shared", workloads, seed=0)
    worst = worst_slowdown(free)
    assert worst > 1.0   # the cheapest size slows some job: there is something to bound
    bounded = replace(tiny, max_slowdown=worst * 0.999)
    chosen = search(bounded, "plexrl-shared", workloads, seed=0)
    assert chosen.chosen != free.chosen
    if worst_slowdown(chosen) > bounded.max_slowdown:   # nothing in bound: the least slowed
        measured = [with_slowdowns(tiny, r, workloads, 0) for r in
                    tried_sizes(tiny, "plexrl-shared", workloads, 0).values()]
        assert worst_slowdown(chosen) == min(map(worst_slowdown, measured))
    else:
        assert chosen.mean("gpu_hours_per_step") >= free.mean("gpu_hours_per_step")
