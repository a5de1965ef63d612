"""Events: what happened (past tense). Drivers build them; ``core.ledger.apply`` folds them in.

Must not know: who produced the event (simulator or runtime) or how.
"""

from __future__ import annotations

from dataclasses import dataclass

from plexrl.core.jobs import JobSpec
from plexrl.protocol import CallId, Function, JobId, Role, StateKey, Tier, WorkerGroupId


@dataclass(frozen=True)
class JobSubmitted:
    spec: JobSpec
    at: float                    #: s


@dataclass(frozen=True)
class CallQueued:
    """A job issued a call; ``seq`` orders the job's calls on one model copy."""

    call: CallId
    job: JobId
    seq: int
    function: Function
    role: Role
    at: float                    #: s
    step: int = 0                #: the job's training step the call belongs to
    num_tokens: int = 0          #: work size: tokens to generate or to train on
    version: int = 0             #: GENERATE: weight version it must sample from; SYNC_WEIGHTS: version it installs
    workspace_bytes: int = 0     #: device bytes the call reserves while it runs (activations)
    lane: int = 0                #: GENERATE, SYNC_WEIGHTS: the rollout lane it runs on (D202)


@dataclass(frozen=True)
class CallFinished:
    call: CallId
    wg: WorkerGroupId
    at: float                    #: s
    duration_s: float            #: measured service time


@dataclass(frozen=True)
class TransitionFinished:
    key: StateKey
    src: Tier
    dst: Tier
    num_bytes: int
    at: float                    #: s
    duration_s: float


@dataclass(frozen=True)
class JobProgress:
    """A job's driver reports its progress: steps done and its recent step time."""

    job: JobId
    at: float
    steps_done: float
    step_s: float


@dataclass(frozen=True)
class WorkerLost:
    wg: WorkerGroupId
    at: float


@dataclass(frozen=True)
class JobEnded:
    job: JobId
    at: float
    reason: str = "finished"


Event = (JobSubmitted | CallQueued | CallFinished | TransitionFinished | JobProgress | WorkerLost
         | JobEnded)
