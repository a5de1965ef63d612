"""Function-level queue policies, chosen by name: ``fcfs``, ``round-robin``, ``hrrs``.

Owns: the ``CallQueue`` protocol (pick one call among the runnable ones of a worker group)
and its three implementations. A policy sees ``Candidate`` values (the call, how long it
has waited, its expected service and switch-in seconds) and never touches the snapshot, so
adding a policy never edits the planner. HRRS is defined in docs/design.md ("HRRS").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from plexrl.core.snapshot import CallView
from plexrl.errors import ConfigError
from plexrl.protocol import JobId


@dataclass(frozen=True)
class Candidate:
    call: CallView
    wait_s: float                #: now - queued_at
    service_s: float             #: expected service time (learned, or cold estimate)
    switch_s: float              #: expected seconds to make its States resident (0 if resident)

    @property
    def arrival(self) -> tuple[float, int]:
        return (self.call.queued_at, self.call.call)


class CallQueue(Protocol):
    name: str

    def pick(self, candidates: Sequence[Candidate], last_job: JobId | None,
             max_wait_s: float) -> Candidate:
        """The candidate to run next on one worker group; ``candidates`` is never empty."""


class FcfsQueue:
    """First come, first served: the oldest call (ties by call id)."""

    name = "fcfs"

    def pick(self, candidates, last_job, max_wait_s):
        return min(candidates, key=lambda c: c.arrival)


class RoundRobinQueue:
    """Jobs take turns: the first job after the last one served (by job id), oldest call first."""

    name = "round-robin"

    def pick(self, candidates, last_job, max_wait_s):
        jobs = sorted({c.call.job for c in candidates})
        later = [j for j in jobs if last_job is not None and j > last_job]
        turn = later[0] if later else jobs[0]
        return min((c for c in candidates if c.call.job == turn), key=lambda c: c.arrival)


class HrrsQueue:
    """Highest response ratio with switch awareness, a job's batch kept together.

    ratio = (wait + service) / (service + switch). A call whose States are resident wins
    ties, short calls pass long ones, and waiting raises every ratio. A call that has waited
    more than ``max_wait_s`` is overdue: overdue calls go first, oldest first (no starvation).
    Otherwise, while the job served last has a runnable call, its calls go on (the rest of
    its batch: LOGPROBS, FORWARD_BACKWARD, OPTIM_STEP), the ratio choosing among them;
    the ratio picks among all jobs only when that job has nothing runnable
    (docs/design-queues.md, Q2).
    """

    name = "hrrs"

    def pick(self, candidates, last_job, max_wait_s):
        overdue = [c for c in candidates if c.wait_s > max_wait_s]
        if overdue:
            return min(overdue, key=lambda c: c.arrival)
        batch = [c for c in candidates if c.call.job == last_job]
        return min(batch or candidates, key=lambda c: (-ratio(c), c.switch_s, c.arrival))


def ratio(c: Candidate) -> float:
    denom = c.service_s + c.switch_s
    return (c.wait_s + c.service_s) / denom if denom > 0 else float("inf")


QUEUES: dict[str, CallQueue] = {q.name: q for q in (FcfsQueue(), RoundRobinQueue(), HrrsQueue())}


def queue_by_name(name: str) -> CallQueue:
    if name not in QUEUES:
        raise ConfigError("unknown queue policy", field="queue_policy", value=name,
                          fix=f"use one of {', '.join(sorted(QUEUES))}")
    return QUEUES[name]
