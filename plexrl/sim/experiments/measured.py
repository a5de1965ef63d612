"""A measured runtime run replayed by the simulator: its jobs' calls and gaps on its one group.

Owns: ``MeasuredJob`` (a driver that issues one step's calls one at a time, each ``gap_s``
after the previous call's result, each holding the group its measured ``duration_s``),
``MeasuredSimulation`` (the simulator's loop with driver timers, the warm-up barrier of a
shared run, moves that queue for the group's one copier and take its measured work per
move, the bytes at the measured bandwidth and a round trip, and a core that
learns the service's compute seconds, as the runtime's does), the one-group cluster as the
runtime builds it for the core (plexrl/runtime/config.py ``cluster_spec``), and
``predict``: device-seconds per training step with each job alone (summed, one after
another) and all together, and each job's slowdown, derived from the simulated call log
as bench/multiplexing.py derives them from the runtime's.
Must not know: the runtime, Ray, how the figures were measured (plexrl/sim/experiments/from_run.py).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from plexrl.core import events as ev
from plexrl.core.cluster import ClusterSpec, DeviceSpec, Direction, NodeSpec, WorkerGroupSpec
from plexrl.core.decisions import Dispatch, Move, Place
from plexrl.core.jobs import JobSpec, ModelDecl
from plexrl.core.snapshot import CoreConfig
from plexrl.protocol import (COPY_OF, CallId, Copy, Function, JobId, NodeId, Role, State, Tier,
                             WorkerGroupId)
from plexrl.sim.experiments.loop import CallRecord, MoveRecord, Simulation, Trace
from plexrl.sim.scenario import MeasuredConfig, MeasuredJobConfig, Scenario

WG = WorkerGroupId("wg0")
NODE = NodeId("n0")


@dataclass(frozen=True)
class DriverReady:
    """A job's driver issues its next call (its gap after the previous result is over)."""

    job: JobId


@dataclass
class StepLog:
    step_begin: list[float] = field(default_factory=list)   #: the driver starts the step
    step_end: list[float] = field(default_factory=list)     #: its last call's result


class MeasuredJob:
    """One job's driver as measured: a step is a fixed sequence of calls, one at a time."""

    def __init__(self, job: JobId, config: MeasuredJobConfig, spec, num_steps: int,
                 barrier_step: int | None):
        self.job, self.config, self.model_spec = job, config, spec
        self.num_steps, self.barrier_step = num_steps, barrier_step
        self.functions = tuple(Function(f) for f in config.functions)
        self.compute_s = config.compute_s or config.duration_s
        self.log = StepLog()
        self.step, self.index = 0, 0       #: the next call to issue: step, place in the step
        self.optims = 0                    #: OPTIM_STEPs issued (the trainer's weight version)
        self.waiting = False               #: at the barrier
        self._seq: dict[tuple[Role, Copy], int] = {}
        self._issued: dict[CallId, int] = {}

    def spec(self) -> JobSpec:
        """As the runtime declares it: a trained policy has a trainer and a rollout copy,
        every copy may go on the one group."""
        copies = (Copy.TRAINER, Copy.ROLLOUT) if self.model_spec.trainable else (Copy.TRAINER,)
        decl = ModelDecl(Role.POLICY, self.model_spec, copies)
        return JobSpec(job=self.job, models=(decl,),
                       candidates=tuple((Role.POLICY, c, (WG,)) for c in copies),
                       staleness=self.config.staleness)

    @property
    def done(self) -> bool:
        return len(self.log.step_end) >= self.num_steps

    def gap_s(self) -> float:
        return self.config.gap_s[self.index]

    def issue(self, now: float, call: CallId) -> ev.CallQueued:
        """The next call of the step, queued now."""
        function, index = self.functions[self.index], self.index
        if index == 0:
            self.log.step_begin.append(now - self.config.gap_s[0])
        version = 0
        if function == Function.GENERATE:
            version = max(0, self.step - self.config.staleness)
        elif function == Function.OPTIM_STEP:
            self.optims += 1
        elif function == Function.SYNC_WEIGHTS:
            version = self.optims
        copy = COPY_OF[function]
        seq = self._seq.get((Role.POLICY, copy), 0)
        self._seq[(Role.POLICY, copy)] = seq + 1
        self._issued[call] = index
        return ev.CallQueued(call=call, job=self.job, seq=seq, function=function, role=Role.POLICY,
                             at=now, step=self.step, version=version,
                             workspace_bytes=self.config.workspace_bytes[index])

    def cost(self, call: CallId) -> tuple[float, float]:
        """(seconds it holds the group, seconds the service computes) of an issued call."""
        index = self._issued[call]
        return self.config.duration_s[index], self.compute_s[index]

    def finished(self, now: float) -> bool:
        """The issued call's result is back; True if the driver goes on (after its gap)."""
        self.index += 1
        if self.index < len(self.functions):
            return True
        self.index, self.step = 0, self.step + 1
        self.log.step_end.append(now)
        if self.done:
            return False
        if self.barrier_step is not None and self.step == self.barrier_step:
            self.waiting = True
            return False
        return True


def cluster(m: MeasuredConfig) -> ClusterSpec:
    """One node, one worker group of ``num_devices`` emulated devices, as the runtime tells
    the core (nominal rates; spill and restore at a quarter of them; no move latency)."""
    device = DeviceSpec(name="emulated", memory_bytes=m.device_bytes, usable_frac=1.0,
                        peak_flops=1e11, hbm_bytes_per_s=1e10)
    rates = {Direction.ONLOAD: m.nominal_bytes_per_s, Direction.OFFLOAD: m.nominal_bytes_per_s,
             Direction.SPILL: m.nominal_bytes_per_s / 4, Direction.RESTORE: m.nominal_bytes_per_s / 4}
    node = NodeSpec(node=NODE, num_devices=m.num_devices, device=device, host_bytes=m.host_bytes,
                    disk_bytes=m.disk_bytes, bytes_per_s=rates)
    return ClusterSpec(nodes={NODE: node},
                       worker_groups={WG: WorkerGroupSpec(wg=WG, nodes=(NODE,),
                                                          num_devices=m.num_devices)})


class MeasuredSimulation(Simulation):
    """The simulator's loop, driven by measured jobs instead of modelled ones."""

    def __init__(self, s: Scenario, names: tuple[str, ...]):
        m = s.measured
        barrier = s.warmup_steps if m.barrier and len(names) > 1 else None
        jobs = {JobId(n): MeasuredJob(JobId(n), m.jobs[n], s.models[m.jobs[n].model].spec(),
                                      s.num_steps, barrier) for n in names}
        achieved = {Direction.ONLOAD: m.onload_bytes_per_s, Direction.OFFLOAD: m.offload_bytes_per_s,
                    Direction.SPILL: m.nominal_bytes_per_s / 4,
                    Direction.RESTORE: m.nominal_bytes_per_s / 4}
        config = CoreConfig(queue_policy=s.queue_policy, prefetch=s.prefetch, backfill=m.backfill)
        super().__init__(cluster(m), config, jobs, {j: job.spec() for j, job in jobs.items()},
                         achieved)
        self.latency_s, self.service_s, self.serial = m.move_latency_s, m.move_service_s, m.serial_moves
        self.copier_free_at: dict[WorkerGroupId, float] = {}

    def _handle(self, item, now: float) -> None:
        if isinstance(item, DriverReady):
            self._fold(self.jobs[item.job].issue(now, CallId(self._next_call())))
            return
        super()._handle(item, now)

    def _on_call_finished(self, call, now: float) -> None:
        job = self.jobs[call.job]
        if job.finished(now):
            self._push(now + job.gap_s(), DriverReady(call.job))
        elif job.waiting and all(j.waiting or j.done for j in self.jobs.values()):
            for waiting in self.jobs.values():      # the barrier opens
                if waiting.waiting:
                    waiting.waiting = False
                    self._push(now + waiting.gap_s(), DriverReady(waiting.job))

    def _on_placed(self, decision: Place, now: float) -> None:
        if decision.job not in [s.job for s in self.snap.pending]:
            self.trace.started[decision.job] = now
            self._push(now + self.jobs[decision.job].gap_s(), DriverReady(decision.job))

    def _dispatch(self, decision: Dispatch, now: float) -> None:
        """The call holds the group its measured seconds; the core learns its compute seconds
        (the runtime's ``CallFinished`` carries the service's duration)."""
        call = self.snap.running[decision.wg]
        held_s, compute_s = self.jobs[call.job].cost(call.call)
        end = now + held_s
        devices = self.snap.cluster.worker_groups[decision.wg].num_devices
        self.trace.calls.append(CallRecord(decision.wg, call.job, call.function, call.step, now,
                                           end, compute_s * devices, call.queued_at))
        self._push(end, ev.CallFinished(call=call.call, wg=decision.wg, at=end,
                                        duration_s=compute_s))

    def _move(self, move: Move, now: float) -> None:
        """The group's copy work (``move_service_s`` + bytes at the measured bandwidth), one
        move at a time if ``serial_moves``, then the round trip ``move_latency_s``; a KV
        cache or a drop moves no bytes and, as in the runtime, takes no time. The core
        learns the copy's own seconds."""
        direction = Direction.of(move.src, move.dst)
        free = move.key.state == State.KV_CACHE or Tier.DROPPED in (move.src, move.dst)
        copy_s = 0.0 if free or direction is None else move.num_bytes / self.achieved[direction]
        end = now
        if not free:
            start = max(now, self.copier_free_at.get(move.wg, now)) if self.serial else now
            done = start + self.service_s + copy_s
            self.copier_free_at[move.wg] = done
            end = done + self.latency_s
        self.trace.moves.append(MoveRecord(move.wg, move.key.job, f"{move.key.copy}/{move.key.state}",
                                           move.reason, now, end, move.num_bytes))
        self._push(end, ev.TransitionFinished(key=move.key, src=move.src, dst=move.dst,
                                              num_bytes=move.num_bytes, at=end, duration_s=copy_s))


# -- what the simulated call log says, as bench/multiplexing.py reads the runtime's ----------
def simulate(s: Scenario, names: tuple[str, ...]) -> tuple[Trace, dict[JobId, MeasuredJob]]:
    sim = MeasuredSimulation(s, names)
    trace = sim.run()
    return trace, sim.jobs


def run_figures(s: Scenario, trace: Trace, jobs: dict[JobId, MeasuredJob]) -> dict:
    """Held seconds (first timed call's start to last timed call's end), busy seconds,
    seconds the group ran nothing while a call was queued (waiting on moves), and each job's
    mean timed step (driver wall time, waits included)."""
    timed = [c for c in trace.calls if c.step >= s.warmup_steps]
    start, end = min(c.start_s for c in timed), max(c.end_s for c in timed)
    moves = [mv for mv in trace.moves if start <= mv.end_s <= end and mv.end_s > mv.start_s]
    steps = {job: [e - b for b, e in zip(j.log.step_begin, j.log.step_end)][s.warmup_steps:]
             for job, j in jobs.items()}
    ordered = sorted(timed, key=lambda c: c.start_s)
    switch_s = sum(max(0.0, nxt.start_s - max(prev.end_s, nxt.queued_s))
                   for prev, nxt in zip(ordered, ordered[1:]))
    return {"held_s": end - start, "busy_s": sum(c.end_s - c.start_s for c in timed),
            "queued_idle_s": switch_s,
            "moves": len(moves), "move_bytes": sum(mv.num_bytes for mv in moves),
            "mean_step_s": {job: statistics.mean(v) for job, v in steps.items()}}


def predict(s: Scenario) -> dict:
    """The run's figures as the simulator predicts them: each job alone, then all together."""
    m = s.measured
    devices, timed = m.num_devices, s.num_steps - s.warmup_steps
    names = tuple(m.jobs)
    alone = {n: run_figures(s, *simulate(s, (n,))) for n in names}
    shared = run_figures(s, *simulate(s, names))
    isolated_s = devices * sum(a["held_s"] for a in alone.values())
    shared_s = devices * shared["held_s"]
    per_step = timed * len(names)
    slowdown = {n: shared["mean_step_s"][n] / alone[n]["mean_step_s"][n] for n in names}
    return {"scenario": s.name, "run": m.run, "steps_per_job": timed,
            "isolated": {"device_s": isolated_s, "device_s_per_step": isolated_s / per_step,
                         "jobs": {n: {"held_s": a["held_s"], "busy_s": a["busy_s"],
                                      "mean_step_s": a["mean_step_s"][n],
                                      "idle_share": 1 - a["busy_s"] / a["held_s"]}
                                  for n, a in alone.items()}},
            "shared": {"device_s": shared_s, "device_s_per_step": shared_s / per_step,
                       "busy_s": shared["busy_s"], "queued_idle_s": shared["queued_idle_s"],
                       "moves": shared["moves"],
                       "move_bytes": shared["move_bytes"],
                       "jobs": {n: {"mean_step_s": shared["mean_step_s"][n],
                                    "slowdown": slowdown[n]} for n in names}},
            "device_s_saving_frac": 1 - shared_s / isolated_s,
            "max_slowdown": max(slowdown.values())}


def render(report: dict) -> str:
    """A plain-text summary of ``predict``'s report."""
    lines = [f"scenario {report['scenario']}  ({report['run']})",
             f"  device-s per step  isolated {report['isolated']['device_s_per_step']:.4f}"
             f"  shared {report['shared']['device_s_per_step']:.4f}"
             f"  saving {100 * report['device_s_saving_frac']:.1f}%",
             f"  {'job':<16}{'alone s':>9}{'shared s':>10}{'slowdown':>10}"]
    for name, row in report["shared"]["jobs"].items():
        alone = report["isolated"]["jobs"][name]["mean_step_s"]
        lines.append(f"  {name:<16}{alone:>9.4f}{row['mean_step_s']:>10.4f}{row['slowdown']:>10.3f}")
    return "\n".join(lines)
