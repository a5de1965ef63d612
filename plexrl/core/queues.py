"""Function-level queue policies, chosen by name: ``fcfs``, ``round-robin``, ``hrrs``.

Owns: the ``CallQueue`` protocol (pick one call among the runnable ones of a worker group,
and say until when that pick cannot turn to given rivals as time passes) and its three
implementations. A policy sees ``Candidate`` values (the call, how long it
has waited, its expected service and switch-in seconds) and never touches the snapshot, so
adding a policy never edits the planner. HRRS is defined in docs/design.md ("HRRS").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, Sequence

from plexrl.core.snapshot import CallView
from plexrl.errors import ConfigError
from plexrl.protocol import Function, JobId, Role


@dataclass(frozen=True)
class Candidate:
    call: CallView
    wait_s: float                #: now - queued_at
    service_s: float             #: expected service time (learned, or cold estimate)
    switch_s: float              #: expected seconds to make its States resident (0 if resident)
    weight: float = 1.0          #: HRRS multiplies the ratio by it (``priority_weight``)

    @property
    def arrival(self) -> tuple[float, int]:
        return (self.call.queued_at, self.call.call)


class CallQueue(Protocol):
    name: str

    def pick(self, candidates: Sequence[Candidate], last_job: JobId | None,
             max_wait_s: float) -> Candidate:
        """The candidate to run next on one worker group; ``candidates`` is never empty."""

    def stable_until(self, candidates: Sequence[Candidate], picked: Candidate,
                     rivals: Sequence[Candidate], last_job: JobId | None, now: float,
                     max_wait_s: float) -> float:
        """A time before which ``pick`` returns none of ``rivals``, with the same candidates
        except for their waits (``picked`` won at ``now``, which the waits were taken at).
        ``inf`` when time alone never changes the pick; ``now`` when the policy cannot say."""


class FcfsQueue:
    """First come, first served: the oldest call (ties by call id)."""

    name = "fcfs"

    def pick(self, candidates, last_job, max_wait_s):
        return min(candidates, key=lambda c: c.arrival)

    def stable_until(self, candidates, picked, rivals, last_job, now, max_wait_s):
        return math.inf   # arrival order does not change with time


class RoundRobinQueue:
    """Jobs take turns: the first job after the last one served (by job id), oldest call first."""

    name = "round-robin"

    def pick(self, candidates, last_job, max_wait_s):
        jobs = sorted({c.call.job for c in candidates})
        later = [j for j in jobs if last_job is not None and j > last_job]
        turn = later[0] if later else jobs[0]
        return min((c for c in candidates if c.call.job == turn), key=lambda c: c.arrival)

    def stable_until(self, candidates, picked, rivals, last_job, now, max_wait_s):
        return math.inf   # job order and arrival order do not change with time


class HrrsQueue:
    """Highest response ratio with switch awareness, a job's batch kept together.

    ratio = weight * (wait + service) / (service + switch), the weight from the job's priority
    (``priority_weight``; 1 at priority 0). A call whose States are resident wins
    ties, short calls pass long ones, and waiting raises every ratio. A call that has waited
    more than ``max_wait_s`` is overdue: overdue calls go first, oldest first (no starvation).
    Otherwise, while the job served last has a runnable call that continues its step's
    batch (``batch_of``: the reference LOGPROBS, FORWARD_BACKWARD, OPTIM_STEP after the
    policy LOGPROBS), those go on, the ratio choosing among them; the ratio picks among all
    jobs when that job's batch has nothing runnable, so its next step's batch competes like
    any other (docs/design.md, D42 and D48).
    """

    name = "hrrs"

    def pick(self, candidates, last_job, max_wait_s):
        overdue = [c for c in candidates if c.wait_s > max_wait_s]
        if overdue:
            return min(overdue, key=lambda c: c.arrival)
        batch = batch_of(candidates, last_job)
        return min(batch or candidates, key=lambda c: (-ratio(c), c.switch_s, c.arrival))

    def stable_until(self, candidates, picked, rivals, last_job, now, max_wait_s):
        """Ratios are lines in time: (t - queued_at + S) / (S + X). The pick cannot turn to a
        rival while the picked ratio stays above the rival's by more than a bound on their
        rounding errors (so float ties never count as a margin), nor once any call can be
        overdue; a rival outside the last job's batch only by being overdue. An overdue pick
        stays: later overdue calls arrived later."""
        if picked.wait_s > max_wait_s or not rivals:
            return math.inf
        batch = {c.call.call for c in batch_of(candidates, last_job)}  # who the ratio picks among
        rivals = [r for r in rivals if not batch or r.call.call in batch]
        until = min(c.call.queued_at + max_wait_s for c in candidates)
        if until < math.inf:
            until -= _ROUNDING * (abs(until) + max_wait_s + 1.0)
        for rival in rivals:
            until = min(until, _overtaken_at(picked, rival, now))
        return max(until, now)


_ROUNDING = 1e-12   #: relative bound on the rounding of a ratio, far above float's 1e-16


def _overtaken_at(picked: Candidate, rival: Candidate, now: float) -> float:
    """The earliest time ``rival``'s ratio may reach ``picked``'s (``now`` when it may now).

    A weight w divides the ratio's denominator: w * (t - q + S) / d = (t - q + S) / (d / w)."""
    dp = (picked.service_s + picked.switch_s) / picked.weight
    dr = (rival.service_s + rival.switch_s) / rival.weight
    if dp <= 0:
        return math.inf if dr > 0 else now   # an infinite ratio is only matched by another
    if dr <= 0 or now < 0:
        return now

    def error(c: Candidate, d: float, t: float) -> float:
        return _ROUNDING * (abs(t) + abs(c.call.queued_at) + c.service_s) / d

    margin = ratio(picked) - ratio(rival) - 2 * (error(picked, dp, now) + error(rival, dr, now))
    if margin <= 0:
        return now
    closing = (1 / dr - 1 / dp) + 2 * _ROUNDING * (1 / dp + 1 / dr)  # per second, errors grow
    return math.inf if closing <= 0 else now + margin / closing


def batch_of(candidates: Sequence[Candidate], last_job: JobId | None) -> list[Candidate]:
    """The candidates that continue the batch ``last_job`` is running on the group.

    A step's batch on the trainer copy begins with its LOGPROBS (the policy's, and the
    reference model's beside it); FORWARD_BACKWARD and OPTIM_STEP continue it. So a policy
    LOGPROBS never continues a batch (its seq follows the previous step's OPTIM_STEP: that
    batch is over), and a reference LOGPROBS continues one only once its step's policy
    LOGPROBS has gone (is no longer a candidate). Other functions of the last job continue.
    """
    heads = {c.call.step for c in candidates
             if c.call.job == last_job and _policy_logprobs(c)}
    return [c for c in candidates if c.call.job == last_job and not _policy_logprobs(c)
            and not (c.call.function == Function.LOGPROBS and c.call.step in heads)]


def _policy_logprobs(c: Candidate) -> bool:
    return c.call.function == Function.LOGPROBS and c.call.role == Role.POLICY


def ratio(c: Candidate) -> float:
    denom = c.service_s + c.switch_s
    return c.weight * (c.wait_s + c.service_s) / denom if denom > 0 else float("inf")


def priority_weight(priority: int) -> float:
    """HRRS weight of a job's calls: 1 + p for priority p >= 0, 1 / (1 - p) below 0, so
    priority 1 doubles a call's ratio and priority -1 halves it (docs/design.md)."""
    return 1.0 + priority if priority >= 0 else 1.0 / (1.0 - priority)


QUEUES: dict[str, CallQueue] = {q.name: q for q in (FcfsQueue(), RoundRobinQueue(), HrrsQueue())}


def queue_by_name(name: str) -> CallQueue:
    if name not in QUEUES:
        raise ConfigError("unknown queue policy", field="queue_policy", value=name,
                          fix=f"use one of {', '.join(sorted(QUEUES))}")
    return QUEUES[name]
