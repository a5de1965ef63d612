"""Cluster-level trace replay: jobs arrive, the core admits and places them, pools step at rates
the call-level simulator measured.

Owns: the strategies by name (``STRATEGIES``: a layout for every job, the core's placement and
backfill knobs), ``StepRates`` (the step time of every job of a pool composition, simulated
once per distinct composition by ``experiment.run_mode`` and memoised), ``replay`` (one trace
under one strategy: the core's ``plan`` at every arrival and finish decides admission,
placement and backfill; between events each job advances at its pool's measured rate) and
the metrics of a replay. Must not know: output formats, where traces come from.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from plexrl.core import apply, assume, plan
from plexrl.core import events as ev
from plexrl.core.decisions import Place, Reject
from plexrl.core.jobs import JobSpec, ModelDecl, PoolRequest
from plexrl.core.snapshot import CoreConfig, Snapshot
from plexrl.errors import PlacementError
from plexrl.protocol import Copy, JobId, Role, WorkerGroupId
from plexrl.sim.experiments.experiment import fixed_sizes, run_mode
from plexrl.sim.experiments.job import SimJob
from plexrl.sim.experiments.loop import Simulation
from plexrl.sim.experiments.modes import achieved, job_id, node_cluster
from plexrl.sim.experiments.pool import map_runs
from plexrl.sim.scenario import Scenario
from plexrl.timeline import Timeline


@dataclass(frozen=True)
class Strategy:
    name: str
    #: "split-async": dedicated pools; "plexrl": private rollout + shared training;
    #: "plexrl-shared": the rollout fleet and the training pool both shared (D207)
    layout: str
    placement: str       #: the core's placement knob
    backfill: bool


STRATEGIES = {s.name: s for s in (
    Strategy("isolated", "split-async", "spread", False),
    Strategy("isolated+backfill", "split-async", "spread", True),
    Strategy("pack", "plexrl", "pack", False),
    Strategy("spread", "plexrl", "spread", False),
    Strategy("spread+backfill", "plexrl", "spread", True),
    Strategy("fleet+backfill", "plexrl-shared", "spread", True),
)}
BASELINE = "isolated"


class StepRates:
    """Step time of each job of a pool composition, from the call-level simulator, memoised.

    A composition is (layout, the sorted workloads of the jobs bound to one training pool);
    ``split-async`` pools are never shared, so their compositions have one workload.
    """

    def __init__(self, s: Scenario):
        self.s = s
        self.memo: dict[tuple[str, tuple[str, ...]], tuple[float, ...]] = {}
        self.simulated = 0

    def of(self, layout: str, workloads: tuple[str, ...]) -> tuple[float, ...]:
        key = (layout, tuple(sorted(workloads)))
        if key not in self.memo:
            self.memo[key] = _simulate(self.s, *key)
            self.simulated += 1
        return self.memo[key]

    def alone(self, workload: str) -> float:
        """The job's step time alone on dedicated pools (the isolated baseline)."""
        return self.of("split-async", (workload,))[0]

    def prefill(self, keys: Sequence[tuple[str, tuple[str, ...]]], workers: int = 2) -> None:
        """Simulate many compositions at once in worker processes (results are identical)."""
        todo = sorted({(layout, tuple(sorted(w))) for layout, w in keys} - set(self.memo),
                      key=lambda k: (-len(k[1]), k))   # the largest first, for balance
        if not todo:
            return
        for key, rates in zip(todo, map_runs(_simulate, [(self.s, layout, w) for layout, w in todo], workers)):
            self.memo[key] = rates
            self.simulated += 1


def _simulate(s: Scenario, layout: str, workloads: tuple[str, ...]) -> tuple[float, ...]:
    model = s.workloads[workloads[0]].model
    result = run_mode(s, layout, workloads, fixed_sizes(s.sizes[model]), s.seed, with_alone=False)
    return tuple(result.jobs[job_id(i, w)].step_s for i, w in enumerate(workloads))


def trace_spec(s: Scenario, job, layout: str, step_s: float) -> JobSpec:
    """The JobSpec of a trace job: its pools cut at admission, its steps and expected step time."""
    w = s.workloads[job.workload]
    m = s.models[w.model]
    sizes = s.sizes[w.model]
    models = [ModelDecl(Role.POLICY, m.spec(), (Copy.TRAINER, Copy.ROLLOUT))]
    if layout == "split-async":
        pools = [PoolRequest(Role.POLICY, Copy.TRAINER, sizes.train_gpus, "train"),
                 PoolRequest(Role.POLICY, Copy.ROLLOUT, sizes.split_rollout_gpus, "rollout")]
    else:   # plexrl-shared: a job brings its share of the fleet, which its pool's jobs share
        rollout = sizes.plexrl_private_gpus if layout == "plexrl" else \
            sizes.fleet_gpus or sizes.plexrl_private_gpus
        pools = [PoolRequest(Role.POLICY, Copy.TRAINER, sizes.train_gpus, "train", pool=f"train/{w.model}"),
                 PoolRequest(Role.POLICY, Copy.ROLLOUT, rollout, "rollout")]
    if w.reference_model:
        models.append(ModelDecl(Role.REFERENCE, m.spec(trainable=False)))
        pools.append(PoolRequest(Role.REFERENCE, Copy.TRAINER, same_as=(Role.POLICY, Copy.TRAINER)))
    return JobSpec(job=JobId(job.job), models=tuple(models), candidates=(), staleness=1,
                   priority=job.priority, pools=tuple(pools), num_steps=job.num_steps, step_s=step_s)


@dataclass
class JobRecord:
    job: JobId
    workload: str
    gpus_isolated: int
    num_steps: int
    alone_s: float               #: num_steps x isolated step time alone
    arrival_s: float
    start_s: float = math.nan
    end_s: float = math.nan


@dataclass
class ReplayResult:
    strategy: str
    jobs: dict[JobId, JobRecord]
    events: int = 0              #: arrivals, finishes and rate changes handled
    plans: int = 0
    timeline: Timeline | None = None

    def metrics(self, isolated_makespan_s: float | None = None) -> dict:
        recs = list(self.jobs.values())
        makespan = max(r.end_s for r in recs) - min(r.arrival_s for r in recs)
        slow = np.array([(r.end_s - r.arrival_s) / r.alone_s for r in recs])
        return {
            "makespan_s": makespan,
            "makespan_frac": makespan / (isolated_makespan_s or makespan),
            "mean_queue_delay_s": float(np.mean([r.start_s - r.arrival_s for r in recs])),
            "mean_jct_s": float(np.mean([r.end_s - r.arrival_s for r in recs])),
            "p95_slowdown": float(np.percentile(slow, 95)),
            "max_slowdown": float(slow.max()),
            "jobs": len(recs),
        }


@dataclass
class _Running:
    workload: str
    steps_done: float
    since: float
    step_s: float
    pool: WorkerGroupId
    version: int = 0             #: bumped at each re-rating; older finish times in the heap are stale


@dataclass
class _Replay:
    s: Scenario
    strategy: Strategy
    rates: StepRates
    snap: Snapshot
    timeline: Timeline | None
    window: tuple[float, float] | None
    running: dict[JobId, _Running] = field(default_factory=dict)
    members: dict[WorkerGroupId, set[JobId]] = field(default_factory=dict)
    finishes: list = field(default_factory=list)


def replay(s: Scenario, jobs: Sequence, strategy: str, rates: StepRates,
           window: tuple[float, float] | None = None, max_events: int = 100_000) -> ReplayResult:
    """Replay ``jobs`` (trace jobs, any order) under ``strategy``; a timeline of ``window`` if given."""
    st = STRATEGIES[strategy]
    config = CoreConfig(queue_policy=s.queue_policy, prefetch=s.prefetch, placement=st.placement,
                        backfill=st.backfill, max_tenants=s.trace.max_tenants)
    r = _Replay(s, st, rates, Snapshot(cluster=node_cluster(s.cluster, s.trace.total_gpus), config=config),
                Timeline(max_events=max_events) if window else None, window)
    arrivals = sorted(jobs, key=lambda j: (j.arrival_s, j.job))
    result = ReplayResult(strategy, {
        JobId(j.job): JobRecord(JobId(j.job), j.workload, j.gpus, j.num_steps,
                                j.num_steps * rates.alone(j.workload), j.arrival_s)
        for j in arrivals})
    specs = {JobId(j.job): trace_spec(s, j, st.layout, rates.of(st.layout, (j.workload,))[0])
             for j in arrivals}
    i = 0
    while i < len(arrivals) or r.running or r.snap.pending:
        now = min(arrivals[i].arrival_s if i < len(arrivals) else math.inf, _next_finish(r))
        if now == math.inf:
            stuck = [spec.job for spec in r.snap.pending]
            raise RuntimeError(f"replay stalled with jobs {stuck[:5]} never admitted (a planner bug)")
        for job in _pop_finished(r, now):
            _end(r, result, job, now)
        while i < len(arrivals) and arrivals[i].arrival_s == now:
            r.snap = apply(r.snap, ev.JobSubmitted(spec=specs[JobId(arrivals[i].job)], at=now))
            i += 1
            result.events += 1
        touched = _admit(r, result, now)
        for pool in sorted(touched):
            result.events += _reprice(r, pool, now)
        _window_counters(r, now)
    result.timeline = r.timeline
    return result


def _next_finish(r: _Replay) -> float:
    while r.finishes:
        at, job, version = r.finishes[0]
        run = r.running.get(job)
        if run is not None and run.version == version:
            return at
        heapq.heappop(r.finishes)
    return math.inf


def _pop_finished(r: _Replay, now: float) -> list[JobId]:
    done = []
    while _next_finish(r) == now:
        done.append(heapq.heappop(r.finishes)[1])
    return done


def _end(r: _Replay, result: ReplayResult, job: JobId, now: float) -> None:
    run = r.running.pop(job)
    r.members[run.pool].discard(job)
    result.jobs[job].end_s = now
    result.events += 1
    _window_span(r, run.pool, job, result.jobs[job].start_s, now)
    r.snap = apply(r.snap, ev.JobEnded(job=job, at=now))
    if r.members[run.pool]:
        _reprice(r, run.pool, now)
    else:
        del r.members[run.pool]


def _admit(r: _Replay, result: ReplayResult, now: float) -> set[WorkerGroupId]:
    """Plan until the core says nothing more; start the jobs it placed; their pools changed."""
    touched: set[WorkerGroupId] = set()
    while True:
        decisions = plan(r.snap, now)
        result.plans += 1
        if not decisions:
            return touched
        for decision in decisions:
            r.snap = assume(r.snap, decision, now)
            if isinstance(decision, Reject):
                raise PlacementError(decision.reason, job=decision.job)
        for job in dict.fromkeys(d.job for d in decisions if isinstance(d, Place)):
            if job in r.snap.jobs and all(s.job != job for s in r.snap.pending):
                pool = r.snap.jobs[job].bindings[(Role.POLICY, Copy.TRAINER)]
                rec = result.jobs[job]
                rec.start_s = now
                r.running[job] = _Running(rec.workload, 0.0, now, math.inf, pool)
                r.members.setdefault(pool, set()).add(job)
                touched.add(pool)


def _reprice(r: _Replay, pool: WorkerGroupId, now: float) -> int:
    """Give every job of a pool the step time of its new composition; report it to the core."""
    members = sorted(r.members[pool], key=lambda j: (r.running[j].workload, j))
    rates = r.rates.of(r.strategy.layout, tuple(r.running[j].workload for j in members))
    for job, step_s in zip(members, rates):
        run = r.running[job]
        if math.isfinite(run.step_s):
            run.steps_done += (now - run.since) / run.step_s
        run.since, run.step_s, run.version = now, step_s, run.version + 1
        remaining = max(0.0, r.snap.jobs[job].spec.num_steps - run.steps_done)
        heapq.heappush(r.finishes, (now + remaining * step_s, job, run.version))
        r.snap = apply(r.snap, ev.JobProgress(job=job, at=now, steps_done=run.steps_done, step_s=step_s))
    return len(members)


def _window_counters(r: _Replay, now: float) -> None:
    if r.timeline is None or not r.window[0] <= now <= r.window[1]:
        return
    held = r.snap.cluster.total_devices - sum(r.snap.free_devices.values())
    r.timeline.counter("cluster", now - r.window[0],
                       {"pending jobs": len(r.snap.pending), "GPUs held": held,
                        "running jobs": len(r.running)})


def _window_span(r: _Replay, pool: WorkerGroupId, job: JobId, start: float, end: float) -> None:
    if r.timeline is None:
        return
    lo, hi = r.window
    a, b = max(start, lo), min(end, hi)
    if a < b:
        track = r.timeline.track(pool, group="worker groups")
        r.timeline.span(track, job, a - lo, b - a)


def replay_calls(s: Scenario, jobs: Sequence, strategy: str, rates: StepRates,
                 check_invariants: bool = False) -> ReplayResult:
    """The same replay with every call of every job simulated (no memo): the memo's yardstick."""
    st = STRATEGIES[strategy]
    config = CoreConfig(queue_policy=s.queue_policy, prefetch=s.prefetch, placement=st.placement,
                        backfill=st.backfill, max_tenants=s.trace.max_tenants)
    arrivals = sorted(jobs, key=lambda j: (j.arrival_s, j.job))
    sim_jobs, specs, at = {}, {}, {}
    for index, j in enumerate(arrivals):
        w = s.workloads[j.workload]
        job = JobId(j.job)
        sim_jobs[job] = SimJob(job, w, s.models[w.model], s.cluster, staleness=1, num_steps=j.num_steps,
                               seed=s.seed * 1000 + index, workspace_frac=s.train_workspace_frac)
        sim_jobs[job].max_steps = j.num_steps
        specs[job] = trace_spec(s, j, st.layout, rates.of(st.layout, (j.workload,))[0])
        at[job] = j.arrival_s
    sim = Simulation(node_cluster(s.cluster, s.trace.total_gpus), config, sim_jobs, specs,
                     achieved(s.cluster), check_invariants=check_invariants, arrivals=at)
    trace = sim.run()
    result = ReplayResult(strategy, {}, plans=trace.plans)
    for j in arrivals:
        job = JobId(j.job)
        result.jobs[job] = JobRecord(job, j.workload, j.gpus, j.num_steps,
                                     j.num_steps * rates.alone(j.workload), j.arrival_s,
                                     trace.started[job], trace.ended[job])
    result.events = len(trace.calls) + len(trace.moves)
    return result
