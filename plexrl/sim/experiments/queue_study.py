"""The queue-policy study: one shared training pool under fcfs, round-robin and hrrs, by load.

Owns: ``study`` (for each load point of a scenario's ``[sweep.axes.load]`` and each queue
policy: the first experiment simulated in plexrl mode at the fixed sizes, its call waits on
the shared training pool, and each job's slowdown against the same job alone under the same
policy), each measured over ``[sweep] seeds`` seeds (the scenario's seed and the next ones),
``offered_load`` and ``wait_stats`` (waits, and the share of calls that were a choice between
jobs). Must not know: output formats, the CLI.

Definitions (docs/design.md):

- a load point sets the mean think time (``reward_s``: the verifier or sandbox time between
  a rollout and its training calls) of the workloads to one value of the ``load`` axis,
  each keeping its share from the scenario (D47); a shorter think time makes every job come
  back to the pool sooner;
- offered load = sum over jobs of (the job's busy seconds on the shared pool per step /
  its step time), both measured with the job alone: the share of the pool the jobs would
  keep busy if sharing cost them nothing. Above about 1 the pool is saturated;
- call wait = start - queued of every call on the shared pool that belongs to a measured
  step (``warmup_steps <= step < num_steps``), so every policy is judged on the same calls;
  ready wait = start - ready, ready = when the call became runnable (its job's previous
  call on the same model copy ended; plexrl/sim/experiments/readiness.py). The claim is tested on
  the ready wait: time behind the job's own earlier calls is its own critical path, which no
  policy can shorten (D46);
- slowdown = step time shared / step time alone (D14); worst-job slowdown = the largest;
- a cell pools the measured calls of every seed for the mean and p99 waits, and takes each
  job's largest slowdown over the seeds (D52): one seed is one trajectory, and at light
  load a few meetings on the pool decide it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from plexrl.errors import ConfigError
from plexrl.protocol import JobId
from plexrl.sim.experiments.experiment import core_config, fixed_sizes
from plexrl.sim.experiments.modes import SHARED_TRAIN, Layout, Sizes, build_layout
from plexrl.sim.experiments.readiness import Dispatched, simulate_recorded
from plexrl.sim.scenario import Scenario
from plexrl.sim.experiments.sweep import variant

POLICIES = ("fcfs", "round-robin", "hrrs")
LOAD_AXIS = "load"
MODE = "plexrl"


@dataclass(frozen=True)
class Alone:
    """One job run with no co-tenant: its measured step time and busy seconds on the pool."""

    step_s: float
    busy_s_per_step: float


@dataclass(frozen=True)
class Waits:
    """Call waits on the shared pool over the measured steps (s)."""

    mean_wait_s: float           #: start - queued
    p99_wait_s: float
    mean_ready_s: float          #: start - ready (the wait the queue policy controls)
    p99_ready_s: float
    num_calls: int
    contended: float             #: share of the calls that started while another job's waited


@dataclass(frozen=True)
class PolicyPoint:
    """One (load, policy) cell of the study."""

    waits: Waits
    slowdown: dict[JobId, float]

    @property
    def worst_slowdown(self) -> float:
        return max(self.slowdown.values())


@dataclass(frozen=True)
class LoadPoint:
    think_s: float               #: every workload's reward_s at this point
    offered_load: float          #: sum over jobs of busy / step time, each alone (first policy,
                                 #: mean over the seeds)
    policies: dict[str, PolicyPoint]


def load_values(s: Scenario) -> tuple[float, ...]:
    axis = s.sweep.axes.get(LOAD_AXIS)
    if axis is None or axis.target != "workloads.*.reward_s":
        raise ConfigError("the queue study needs a load axis on the think time", file=s.source,
                          field=f"sweep.axes.{LOAD_AXIS}",
                          fix='add [sweep.axes.load] with target = "workloads.*.reward_s"')
    return axis.values


def at_load(s: Scenario, think_s: float, policy: str) -> Scenario:
    """The scenario at one load point, under one queue policy: every workload's think time
    scaled by one factor so that their mean is ``think_s`` (each keeps its share, D47)."""
    mean = float(np.mean([w.reward_s for w in s.workloads.values()]))
    overrides = [f"workloads.{name}.reward_s={think_s * w.reward_s / mean!r}"
                 for name, w in s.workloads.items()]
    return replace(variant(s, overrides), queue_policy=policy)


def measured(calls: list[Dispatched], warmup_steps: int, num_steps: int) -> list[Dispatched]:
    """Calls on the shared training pool that belong to a measured step."""
    return [c for c in calls
            if c.record.wg == SHARED_TRAIN and warmup_steps <= c.record.step < num_steps]


def wait_stats(runs: list[list[Dispatched]], warmup_steps: int, num_steps: int) -> Waits:
    """Mean and p99 of both waits on the shared pool over the measured steps of all
    ``runs`` pooled (one run per seed), and how many of those calls were a choice between
    jobs (another job's call of the same run was ready and waiting)."""
    calls, contended = [], 0
    for run in runs:
        pool = [c for c in run if c.record.wg == SHARED_TRAIN]
        mine = measured(run, warmup_steps, num_steps)
        contended += sum(any(o.record.job != c.record.job
                             and o.ready_s <= c.record.start_s < o.record.start_s
                             for o in pool) for c in mine)
        calls += mine
    if not calls:
        raise ValueError("no measured calls on the shared training pool")
    wait = np.array([c.wait_s for c in calls])
    ready = np.array([c.wait_ready_s for c in calls])
    return Waits(float(wait.mean()), float(np.percentile(wait, 99)),
                 float(ready.mean()), float(np.percentile(ready, 99)), len(calls),
                 contended / len(calls))


def step_s(ends: list[float], warmup_steps: int, num_steps: int) -> float:
    """Mean time of the measured steps, as ``experiment`` measures it (D14)."""
    return (ends[num_steps - 1] - ends[warmup_steps - 1]) / (num_steps - warmup_steps)


def simulate(s: Scenario, layout: Layout, memo: dict | None) -> list[Dispatched]:
    """Every dispatched call of ``layout`` run under ``s``; rollouts shared through ``memo``
    (one study's runs differ only in think time, queue policy and co-tenants, none of which
    changes a job's rollouts: SimJob._rollout_cost)."""
    for sim_job in layout.jobs.values():
        sim_job.rollout_memo = memo
    return simulate_recorded(layout, core_config(s))[1]


def alone(s: Scenario, workloads: tuple[str, ...], sizes: Sizes, seed: int,
          memo: dict | None = None) -> dict[JobId, Alone]:
    """Each job of an experiment run with no co-tenant (same id, seed, sizes and policy)."""
    out = {}
    for index, name in enumerate(workloads):
        layout = build_layout(s, MODE, (name,), sizes, seed, indexes=(index,))
        calls = simulate(s, layout, memo)
        for job, sim_job in layout.jobs.items():
            busy = sum(c.record.end_s - c.record.start_s
                       for c in measured(calls, s.warmup_steps, s.num_steps))
            out[job] = Alone(step_s(sim_job.log.step_end, s.warmup_steps, s.num_steps),
                             busy / (s.num_steps - s.warmup_steps))
    return out


def offered_load(jobs: dict[JobId, Alone]) -> float:
    return sum(a.busy_s_per_step / a.step_s for a in jobs.values())


def run_shared(s: Scenario, workloads: tuple[str, ...], sizes: Sizes, seed: int,
               solo: dict[JobId, Alone], memo: dict | None = None
               ) -> tuple[list[Dispatched], dict[JobId, float]]:
    """The experiment shared under ``s.queue_policy``: its calls, and slowdowns against ``solo``."""
    layout = build_layout(s, MODE, workloads, sizes, seed)
    calls = simulate(s, layout, memo)
    slowdown = {job: step_s(j.log.step_end, s.warmup_steps, s.num_steps) / solo[job].step_s
                for job, j in layout.jobs.items()}
    return calls, slowdown


def run_policy(s: Scenario, workloads: tuple[str, ...], sizes: Sizes, seeds: tuple[int, ...],
               memos: dict[int, dict] | None = None) -> tuple[PolicyPoint, float]:
    """The experiment shared under ``s.queue_policy`` once per seed: waits pooled over the
    seeds, each job's largest slowdown over them; and the mean offered load."""
    runs, slowdown, offered = [], {}, []
    for seed in seeds:
        memo = None if memos is None else memos.setdefault(seed, {})
        solo = alone(s, workloads, sizes, seed, memo)
        calls, by_job = run_shared(s, workloads, sizes, seed, solo, memo)
        runs.append(calls)
        offered.append(offered_load(solo))
        for job, v in by_job.items():
            slowdown[job] = max(v, slowdown.get(job, v))
    return (PolicyPoint(wait_stats(runs, s.warmup_steps, s.num_steps), slowdown),
            float(np.mean(offered)))


def seeds(s: Scenario) -> tuple[int, ...]:
    """The seeds a cell is measured over: the scenario's and the next ``sweep.seeds - 1``
    (as ``sweep.run_sweep`` takes them)."""
    return tuple(range(s.seed, s.seed + s.sweep.seeds))


def study(s: Scenario, policies: tuple[str, ...] = POLICIES,
          seeds_: tuple[int, ...] | None = None) -> list[LoadPoint]:
    """Every load point of ``s`` under every policy, for its first experiment, each cell
    over ``seeds_`` (default ``seeds(s)``). A memo per seed shares rollouts between runs."""
    seeds_ = seeds(s) if seeds_ is None else seeds_
    workloads = next(iter(s.experiments.values())).workloads
    sizes = fixed_sizes(s.sizes[s.workloads[workloads[0]].model])
    points, memos = [], {}
    for think_s in load_values(s):
        cells, offered = {}, None
        for policy in policies:
            cells[policy], load = run_policy(at_load(s, think_s, policy), workloads, sizes,
                                             seeds_, memos)
            offered = load if offered is None else offered
        points.append(LoadPoint(think_s, offered, cells))
    return points


def to_json(points: list[LoadPoint]) -> list[dict]:
    """JSON-ready rows, one per load point, rounded for reading."""
    return [{"think_s": p.think_s, "offered_load": round(p.offered_load, 3),
             "policies": {name: {"mean_wait_s": round(c.waits.mean_wait_s, 3),
                                 "p99_wait_s": round(c.waits.p99_wait_s, 3),
                                 "mean_ready_wait_s": round(c.waits.mean_ready_s, 3),
                                 "p99_ready_wait_s": round(c.waits.p99_ready_s, 3),
                                 "num_calls": c.waits.num_calls,
                                 "contended": round(c.waits.contended, 3),
                                 "worst_slowdown": round(c.worst_slowdown, 4),
                                 "slowdown": {j: round(v, 4) for j, v in sorted(c.slowdown.items())}}
                          for name, c in p.policies.items()}}
            for p in points]
