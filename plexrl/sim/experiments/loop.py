"""The virtual-clock driver of the core: a heap of timed events, the core, a fake cluster.

Owns: ``Simulation``: it folds events into the snapshot, calls ``core.plan`` after every
batch of simultaneous events, checks the numbered invariants (optional), and executes each
decision on a fake cluster whose calls take what ``SimJob.cost`` says and whose transfers
take bytes / the *achieved* bandwidth (the core only knows nominal figures and learns the
rest). Records every call and transition for accounting and timelines. A plain heap
ordered by (time, sequence) beat SimPy on this workload (bench/sim_loop.py).
Must not know: modes, sizes, reports.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

from plexrl.core import apply, assume, plan
from plexrl.core import events as ev
from plexrl.core.cluster import ClusterSpec, Direction
from plexrl.core.costs import transition_s
from plexrl.core.decisions import Dispatch, Move, Place, Reject
from plexrl.core.invariants import check_decisions, check_step, enforce
from plexrl.core.snapshot import CoreConfig, Snapshot
from plexrl.errors import PlacementError
from plexrl.protocol import Copy, Function, JobId, Role, WorkerGroupId
from plexrl.sim.experiments.job import SimJob


@dataclass(frozen=True)
class CallRecord:
    wg: WorkerGroupId
    job: JobId
    function: Function
    step: int
    start_s: float
    end_s: float
    useful_gpu_s: float
    queued_s: float = 0.0        #: when the job issued the call (wait = start_s - queued_s)


@dataclass(frozen=True)
class MoveRecord:
    wg: WorkerGroupId
    job: JobId
    what: str
    reason: str
    start_s: float
    end_s: float
    num_bytes: int


@dataclass(frozen=True)
class RewardReady:
    """A job's verifier finished scoring a step's rollout (a driver-side timer)."""

    job: JobId
    step: int


@dataclass
class Trace:
    """Everything that happened, for accounting and timelines."""

    calls: list[CallRecord] = field(default_factory=list)
    moves: list[MoveRecord] = field(default_factory=list)
    plans: int = 0
    end_s: float = 0.0
    started: dict[JobId, float] = field(default_factory=dict)  #: when each job was placed
    ended: dict[JobId, float] = field(default_factory=dict)    #: arrivals mode: when each job ended
    bound: dict[WorkerGroupId, list[JobId]] = field(default_factory=dict)  #: jobs placed on each group


class Simulation:
    """Runs jobs to completion on a cluster under the core's decisions."""

    def __init__(self, cluster: ClusterSpec, config: CoreConfig, jobs: dict[JobId, SimJob],
                 specs: dict[JobId, "ev.JobSpec"], achieved_bytes_per_s: dict[Direction, float],
                 *, check_invariants: bool = True, arrivals: dict[JobId, float] | None = None):
        """``arrivals``: submit each job at its time and end it after its ``num_steps`` (a
        trace replay); without them every job is submitted at 0 and runs to the end."""
        self.snap = Snapshot(cluster=cluster, config=config)
        self.arrivals = arrivals
        self.jobs, self.specs = jobs, specs
        self.achieved = achieved_bytes_per_s
        self.check = check_invariants
        self.trace = Trace()
        self._heap: list = []
        self._seq = itertools.count()
        self._call_ids = itertools.count()

    def run(self, max_events: int = 10_000_000) -> Trace:
        for job in self.jobs:
            at = self.arrivals[job] if self.arrivals is not None else 0.0
            self._push(at, ev.JobSubmitted(spec=self.specs[job], at=at))
        handled = 0
        while self._heap and not all(job.done for job in self.jobs.values()):
            now = self._heap[0][0]
            while self._heap and self._heap[0][0] == now:
                _, _, item = heapq.heappop(self._heap)
                self._handle(item, now)
                handled += 1
            self._plan(now)
            if handled > max_events:
                raise RuntimeError(f"simulation did not finish within {max_events} events")
        if not all(job.done for job in self.jobs.values()):
            stuck = [j for j, job in self.jobs.items() if not job.done]
            raise RuntimeError(f"simulation stalled with jobs {stuck} unfinished (a planner bug)")
        self.trace.end_s = max(job.log.step_end[-1] for job in self.jobs.values())
        return self.trace

    # -- events ---------------------------------------------------------------------------
    def _push(self, at: float, item) -> None:
        heapq.heappush(self._heap, (at, next(self._seq), item))

    def _handle(self, item, now: float) -> None:
        if isinstance(item, RewardReady):
            trainer = self.snap.jobs[item.job].bindings[(Role.POLICY, Copy.TRAINER)]
            budget = self.snap.cluster.device_budget(trainer)
            for call in self.jobs[item.job].training_calls(item.step, now, self._next_call, budget):
                self._fold(call)
            return
        running = self.snap.running.get(item.wg) if isinstance(item, ev.CallFinished) else None
        self._fold(item)
        if isinstance(item, ev.JobSubmitted):
            return
        if running is not None:
            self._on_call_finished(running, now)

    def _fold(self, event) -> None:
        before = self.snap
        self.snap = apply(self.snap, event)
        if self.check:
            enforce(check_step(before, self.snap))

    def _on_call_finished(self, call, now: float) -> None:
        job = self.jobs[call.job]
        if call.function == Function.GENERATE:
            if job.on_generated(call.step):
                self._push(now + job.workload.reward_s, RewardReady(call.job, call.step))
        elif call.function == Function.OPTIM_STEP:
            job.on_trained(now)
            if self.arrivals is not None:
                self._report_progress(call.job, now)
        for queued in job.advance(now, self._next_call):
            self._fold(queued)

    def _report_progress(self, job: JobId, now: float) -> None:
        """Tell the core how far the job is (for backfilling); end it after its last step."""
        sim_job = self.jobs[job]
        ends = [self.trace.started[job], *sim_job.log.step_end]
        recent = ends[-4:]
        self._fold(ev.JobProgress(job=job, at=now, steps_done=sim_job.trained,
                                  step_s=(recent[-1] - recent[0]) / (len(recent) - 1)))
        if sim_job.done:
            self._fold(ev.JobEnded(job=job, at=now))
            self.trace.ended[job] = now

    def _next_call(self) -> int:
        return next(self._call_ids)

    # -- decisions ------------------------------------------------------------------------
    def _plan(self, now: float) -> None:
        """Plan until the core has nothing more to say at this instant."""
        while True:
            decisions = plan(self.snap, now)
            self.trace.plans += 1
            if not decisions:
                return
            if self.check:
                enforce(check_decisions(self.snap, decisions, now))
            for decision in decisions:
                self.snap = assume(self.snap, decision, now)
                self._execute(decision, now)

    def _execute(self, decision, now: float) -> None:
        if isinstance(decision, Reject):
            raise PlacementError(decision.reason, job=decision.job)
        if isinstance(decision, Place):
            self._on_placed(decision, now)
        elif isinstance(decision, Dispatch):
            self._dispatch(decision, now)
        elif isinstance(decision, Move):
            self._move(decision, now)

    def _on_placed(self, decision: Place, now: float) -> None:
        on = self.trace.bound.setdefault(decision.wg, [])
        if decision.job not in on:
            on.append(decision.job)
        job = self.snap.jobs.get(decision.job)
        if job is not None and decision.job not in [s.job for s in self.snap.pending]:
            self.trace.started[decision.job] = now
            for queued in self.jobs[decision.job].advance(now, self._next_call):
                self._fold(queued)

    def _dispatch(self, decision: Dispatch, now: float) -> None:
        call = self.snap.running[decision.wg]
        bindings = self.snap.jobs[call.job].bindings
        colocated = bindings[(call.role, Copy.ROLLOUT)] == bindings.get((call.role, Copy.TRAINER)) \
            if call.function == Function.SYNC_WEIGHTS else False
        devices = self.snap.cluster.worker_groups[decision.wg].num_devices
        cost = self.jobs[call.job].cost(call, devices, colocated)
        end = now + cost.duration_s
        self.trace.calls.append(CallRecord(decision.wg, call.job, call.function, call.step, now,
                                           end, cost.useful_gpu_s, call.queued_at))
        self._push(end, ev.CallFinished(call=call.call, wg=decision.wg, at=end,
                                        duration_s=cost.duration_s))

    def _move(self, move: Move, now: float) -> None:
        seconds = transition_s(self.snap.cluster, move.wg, move.src, move.dst, move.num_bytes,
                               self.achieved)
        end = now + seconds
        self.trace.moves.append(MoveRecord(move.wg, move.key.job, f"{move.key.copy}/{move.key.state}",
                                           move.reason, now, end, move.num_bytes))
        self._push(end, ev.TransitionFinished(key=move.key, src=move.src, dst=move.dst,
                                              num_bytes=move.num_bytes, at=end, duration_s=seconds))
