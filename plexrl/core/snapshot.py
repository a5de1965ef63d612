"""The immutable picture of the cluster that ``plan`` reads.

Owns: ``StateView`` (where one State is, how big, which version), ``CallView`` (a queued or
running call), ``JobView`` (a placed job's bindings and per-copy order), ``CoreConfig``
(policy knobs) and ``Snapshot``. The dicts inside a Snapshot are never mutated: the ledger
builds a new Snapshot for every change (copy on write). Must not know: clocks, drivers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from plexrl.core.cluster import ClusterSpec
from plexrl.core.costs import Estimates
from plexrl.core.jobs import JobSpec
from plexrl.protocol import (COPY_OF, CallId, Copy, Function, JobId, NodeId, Role, StateKey, Tier,
                             WorkerGroupId)


@dataclass(frozen=True)
class StateView:
    key: StateKey
    wg: WorkerGroupId            #: the worker group its copy is bound to
    num_bytes: int
    tier: Tier                   #: where the current copy is
    version: int = 0             #: WEIGHTS: optimizer steps applied (trainer) or installed (rollout)
    moving_to: Tier | None = None  #: destination of an in-flight transition
    pinned: bool = False         #: lives on HOST by design (ZeRO-offload optimizer)


@dataclass(frozen=True)
class CallView:
    call: CallId
    job: JobId
    seq: int                     #: order of the job's calls on this model copy
    function: Function
    role: Role
    wg: WorkerGroupId
    queued_at: float             #: s
    step: int = 0
    num_tokens: int = 0
    version: int = 0
    workspace_bytes: int = 0
    started_at: float | None = None

    @property
    def copy(self) -> Copy:
        return COPY_OF[self.function]


@dataclass(frozen=True)
class JobView:
    spec: JobSpec
    bindings: dict[tuple[Role, Copy], WorkerGroupId]
    next_seq: dict[tuple[Role, Copy], int]   #: the seq allowed to run next, per copy
    admitted_at: float
    steps_done: float = 0.0      #: from the last JobProgress
    step_s: float = 0.0          #: recent step time from the last JobProgress (0: none yet)
    progress_at: float = 0.0

    @property
    def expected_end(self) -> float:
        """When the job should finish, from its progress (or its declared step time)."""
        step_s = self.step_s or self.spec.step_s
        if not self.spec.num_steps or not step_s:
            return float("inf")
        start = self.progress_at if self.step_s else self.admitted_at
        return start + max(0.0, self.spec.num_steps - self.steps_done) * step_s


@dataclass(frozen=True)
class CoreConfig:
    """Scheduling knobs, chosen by name where there is a choice."""

    queue_policy: str = "hrrs"   #: "fcfs", "round-robin" or "hrrs"
    prefetch: bool = True        #: onload the next call's States while the current one runs
    max_wait_s: float = 600.0    #: hrrs: a call waiting longer than this is served first (FCFS)
    ema_alpha: float = 0.3       #: weight of a new observation in learned costs
    placement: str = "spread"    #: "spread" (fewest co-tenants, new pools first) or "pack"
    backfill: bool = True        #: start later jobs while the first waits, if they do not delay it
    max_tenants: int = 3         #: jobs per shareable (pooled) worker group


@dataclass(frozen=True)
class Snapshot:
    cluster: ClusterSpec
    config: CoreConfig = field(default_factory=CoreConfig)
    jobs: dict[JobId, JobView] = field(default_factory=dict)
    pending: tuple[JobSpec, ...] = ()            #: submitted, not yet placed
    states: dict[StateKey, StateView] = field(default_factory=dict)
    queued: tuple[CallView, ...] = ()            #: in arrival order
    running: dict[WorkerGroupId, CallView] = field(default_factory=dict)
    last_job: dict[WorkerGroupId, JobId] = field(default_factory=dict)  #: last dispatched, per group
    onloading: dict[WorkerGroupId, CallId] = field(default_factory=dict)  #: call States are moving for
    estimates: Estimates = field(default_factory=Estimates)

    def states_on(self, wg: WorkerGroupId) -> list[StateView]:
        return [s for s in self.states.values() if s.wg == wg]

    # Derived totals, computed once per Snapshot (it never changes) on first use; a changed
    # Snapshot is a new object, so they can never be stale. ``plexrl.core.usage`` reads them.
    @cached_property
    def device_state_bytes(self) -> dict[WorkerGroupId, int]:
        """Bytes of States on, or arriving at, each worker group's devices."""
        used = dict.fromkeys(self.cluster.worker_groups, 0)
        for view in self.states.values():
            if view.tier == Tier.DEVICE or view.moving_to == Tier.DEVICE:
                used[view.wg] += view.num_bytes
        return used

    @cached_property
    def host_state_bytes(self) -> dict[NodeId, float]:
        """Bytes of States parked on, or arriving at, each node's host memory."""
        per_group: dict[WorkerGroupId, int] = {}
        for view in self.states.values():
            if view.tier == Tier.HOST or view.moving_to == Tier.HOST:
                per_group[view.wg] = per_group.get(view.wg, 0) + view.num_bytes
        used = dict.fromkeys(self.cluster.nodes, 0.0)
        for wg, num_bytes in per_group.items():
            nodes = self.cluster.worker_groups[wg].nodes
            for node in nodes:
                used[node] += num_bytes / len(nodes)
        return used

    @cached_property
    def free_devices(self) -> dict[NodeId, int]:
        """Devices of each node that no worker group holds."""
        free = {n: spec.num_devices for n, spec in self.cluster.nodes.items()}
        for group in self.cluster.worker_groups.values():
            for node in group.nodes:
                free[node] -= group.num_devices // len(group.nodes)
        return free

    @cached_property
    def num_bound_jobs(self) -> dict[WorkerGroupId, int]:
        """Jobs with at least one copy bound to each worker group."""
        count = dict.fromkeys(self.cluster.worker_groups, 0)
        for job in self.jobs.values():
            for wg in set(job.bindings.values()):
                count[wg] += 1
        return count
