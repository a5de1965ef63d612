"""When each call became runnable on its worker group, and how long it waited from then.

Owns: ``Dispatched`` (one dispatched call: its record, its model copy and seq, and when it
became ready), ``simulate_recorded`` (simulate a layout keeping each dispatched call's
role and seq beside its record) and ``readiness`` (the ready time of every call).
Must not know: queue policies, scenarios, sizes, output formats.

Two waits of one call (docs/design.md, D46):

- wait = start - queued: everything between the job issuing the call and its dispatch;
- wait_ready = start - ready, ready = max(queued, end of the same job's previous call on
  the same model copy: same role and copy, seq - 1). A job's calls on one copy run in seq
  order, so the time a call spends behind its own job's earlier calls is that job's own
  critical path, not queueing a policy controls. GENERATE's and SYNC_WEIGHTS's version
  conditions are not included (they hold on the job's private rollout group, never on the
  shared training pool this is measured on), so for those two ``ready`` can be early.

``CallRecord`` carries neither the role nor the seq, so ``RecordingSimulation`` reads them
from the snapshot at each dispatch (the running call's view); it changes nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

from plexrl.core.snapshot import CallView
from plexrl.protocol import Copy, JobId, Role
from plexrl.sim.experiments.loop import CallRecord, Simulation, Trace


@dataclass(frozen=True)
class Dispatched:
    record: CallRecord
    role: Role
    copy: Copy
    seq: int                     #: order of the job's calls on this model copy
    ready_s: float               #: max(queued, end of the previous call on the copy)

    @property
    def wait_s(self) -> float:
        return self.record.start_s - self.record.queued_s

    @property
    def wait_ready_s(self) -> float:
        return self.record.start_s - self.ready_s


class RecordingSimulation(Simulation):
    """A ``Simulation`` that also keeps the view of every call it dispatches, in order."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.views: list[CallView] = []

    def _dispatch(self, decision, now):
        self.views.append(self.snap.running[decision.wg])
        super()._dispatch(decision, now)


def simulate_recorded(layout, config) -> tuple[Trace, list[Dispatched]]:
    """Simulate ``layout`` under the core ``config``: its trace and every call's readiness."""
    sim = RecordingSimulation(layout.cluster, config, layout.jobs, layout.specs,
                              layout.achieved_bytes_per_s)
    trace = sim.run()
    return trace, readiness(trace.calls, sim.views)


def readiness(records: list[CallRecord], views: list[CallView]) -> list[Dispatched]:
    """Each record with its ready time; ``views[i]`` is the call dispatched as ``records[i]``."""
    if len(records) != len(views):
        raise ValueError(f"{len(records)} call records but {len(views)} dispatched views")
    ends: dict[tuple[JobId, Role, Copy, int], float] = {}
    for record, view in zip(records, views):
        ends[(view.job, view.role, view.copy, view.seq)] = record.end_s
    out = []
    for record, view in zip(records, views):
        if (record.job, record.start_s, record.queued_s) != (view.job, view.started_at, view.queued_at):
            raise ValueError(f"record and view of call {view.call} disagree")
        before = ends.get((view.job, view.role, view.copy, view.seq - 1), record.queued_s)
        out.append(Dispatched(record, view.role, view.copy, view.seq, max(record.queued_s, before)))
    return out
