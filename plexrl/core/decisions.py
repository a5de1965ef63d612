"""Decisions: what the core wants done (imperative). One executor per driver acts on them.

An eviction is a ``Move`` whose ``reason`` is ``"evict"`` (docs/design.md: one decision type
for every transition). Must not know: how a decision is carried out.
"""

from __future__ import annotations

from dataclasses import dataclass

from plexrl.core.cluster import WorkerGroupSpec
from plexrl.protocol import CallId, Copy, JobId, Role, StateKey, Tier, WorkerGroupId


@dataclass(frozen=True)
class Place:
    """Bind one copy of a job's model to a worker group, for the life of the job."""

    job: JobId
    role: Role
    copy: Copy
    wg: WorkerGroupId
    carve: WorkerGroupSpec | None = None  #: a new group cut from free devices for this copy
    lane: int = 0                #: which rollout lane of the copy (D202)


@dataclass(frozen=True)
class Reject:
    """Refuse a job; ``reason`` says what did not fit, with sizes, and how to fix it."""

    job: JobId
    reason: str


@dataclass(frozen=True)
class Dispatch:
    """Run a queued call now on its worker group; ``uses`` are the States it reads/writes."""

    call: CallId
    wg: WorkerGroupId
    uses: tuple[StateKey, ...]


@dataclass(frozen=True)
class Move:
    """Start a transition of one State between tiers.

    ``reason``: "onload" (a queued call needs it), "prefetch" (the next call will),
    "evict" (make room), "spill" (make host room), "restore" (DISK to HOST), "rebuild" (KV
    cache from DROPPED).
    """

    key: StateKey
    src: Tier
    dst: Tier
    num_bytes: int
    wg: WorkerGroupId
    reason: str
    for_call: CallId | None = None   #: the call it makes room for, if any


Decision = Place | Reject | Dispatch | Move
