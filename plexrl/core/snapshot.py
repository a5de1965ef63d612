"""The immutable picture of the cluster that ``plan`` reads.

Owns: ``StateView`` (where one State is, how big, which version), ``CallView`` (a queued or
running call), ``JobView`` (a placed job's bindings and per-copy order), ``CoreConfig``
(policy knobs) and ``Snapshot``. The dicts inside a Snapshot are never mutated: the ledger
builds a new Snapshot for every change (copy on write). Must not know: clocks, drivers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

from plexrl.core.cluster import ClusterSpec
from plexrl.core.estimates import Estimates
from plexrl.core.jobs import JobSpec
from plexrl.protocol import (COPY_OF, CallId, Copy, Function, JobId, NodeId, Role, StateKey, Tier,
                             WorkerGroupId, copy_id)


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
    lane: int = 0                #: the rollout lane of its copy (0: the copy itself)

    @property
    def copy(self) -> Copy:
        return COPY_OF[self.function]

    @property
    def copy_id(self) -> tuple:
        """The key of its copy in its job's bindings and call order."""
        return copy_id(self.role, self.copy, self.lane)


@dataclass(frozen=True)
class JobView:
    spec: JobSpec
    bindings: dict[tuple, WorkerGroupId]     #: per ``copy_id``: (role, copy[, lane])
    next_seq: dict[tuple, int]   #: the seq allowed to run next, per copy
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
    pipeline: bool = False       #: dispatch the next call behind the running one (D180)
    pipeline_lead_s: float = 0.005   #: how long before the running call's expected end (D184)
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
    behind: dict[WorkerGroupId, CallView] = field(default_factory=dict)  #: runs when running ends
    last_job: dict[WorkerGroupId, JobId] = field(default_factory=dict)  #: last dispatched, per group
    onloading: dict[WorkerGroupId, CallId] = field(default_factory=dict)  #: call States are moving for
    estimates: Estimates = field(default_factory=Estimates)

    def states_on(self, wg: WorkerGroupId) -> list[StateView]:
        return list(self.states_by_group.get(wg, {}).values())

    # Derived indexes and totals, computed once per Snapshot (it never changes) on first use;
    # a changed Snapshot is a new object, so they can never be stale. The ledger's folds hand
    # the ones already computed on to the next Snapshot, updated by what changed
    # (``plexrl.core.carry``); a Snapshot built any other way computes them afresh.
    @cached_property
    def group_order(self) -> tuple[WorkerGroupId, ...]:
        """Worker groups in the order a planning cycle visits them."""
        return tuple(sorted(self.cluster.worker_groups))

    @cached_property
    def groups_on_node(self) -> dict[NodeId, tuple[WorkerGroupId, ...]]:
        on: dict[NodeId, list[WorkerGroupId]] = {n: [] for n in self.cluster.nodes}
        for wg in self.group_order:
            for node in self.cluster.worker_groups[wg].nodes:
                on[node].append(wg)
        return {n: tuple(wgs) for n, wgs in on.items()}

    @cached_property
    def neighbours(self) -> dict[WorkerGroupId, frozenset[WorkerGroupId]]:
        """Worker groups sharing a node (so host memory) with each group, itself included."""
        return {wg: frozenset(g for n in spec.nodes for g in self.groups_on_node[n])
                for wg, spec in self.cluster.worker_groups.items()}

    @cached_property
    def states_by_group(self) -> dict[WorkerGroupId, dict[StateKey, StateView]]:
        """The States bound to each worker group, keyed as in ``states``."""
        by: dict[WorkerGroupId, dict[StateKey, StateView]] = {wg: {} for wg in self.group_order}
        for key, view in self.states.items():
            by.setdefault(view.wg, {})[key] = view
        return by

    @cached_property
    def queued_by_group(self) -> dict[WorkerGroupId, tuple[CallView, ...]]:
        """The queued calls bound to each worker group, in arrival order (absent: none)."""
        by: dict[WorkerGroupId, list[CallView]] = {}
        for call in self.queued:
            by.setdefault(call.wg, []).append(call)
        return {wg: tuple(calls) for wg, calls in by.items()}

    @cached_property
    def device_state_bytes(self) -> dict[WorkerGroupId, int]:
        """Bytes of States on, or arriving at, each worker group's devices."""
        return {wg: self.device_state_bytes_of(wg) for wg in self.cluster.worker_groups}

    def device_state_bytes_of(self, wg: WorkerGroupId) -> int:
        return sum(v.num_bytes for v in self.states_by_group.get(wg, {}).values()
                   if v.tier == Tier.DEVICE or v.moving_to == Tier.DEVICE)

    @cached_property
    def host_state_bytes(self) -> dict[NodeId, float]:
        """Bytes of States parked on, or arriving at, each node's host memory."""
        return {node: self.host_state_bytes_of(node) for node in self.cluster.nodes}

    def host_bytes_on(self, node: NodeId) -> float:
        """``host_state_bytes[node]``, without computing every other node's when not known yet."""
        known = self.__dict__.get("host_state_bytes")
        return known[node] if known is not None else self.host_state_bytes_of(node)

    def host_state_bytes_of(self, node: NodeId) -> float:
        """A group's parked bytes (an exact integer) spread evenly over its nodes; the shares
        summed exactly (``fsum``), so the total does not depend on any order."""
        shares = []
        for wg in self.groups_on_node[node]:
            parked = sum(v.num_bytes for v in self.states_by_group[wg].values()
                         if v.tier == Tier.HOST or v.moving_to == Tier.HOST)
            if parked:
                shares.append(parked / len(self.cluster.worker_groups[wg].nodes))
        return math.fsum(shares)

    @cached_property
    def free_devices(self) -> dict[NodeId, int]:
        """Devices of each node that no worker group holds."""
        free = {n: spec.num_devices for n, spec in self.cluster.nodes.items()}
        for group in self.cluster.worker_groups.values():
            for node, devices in group.devices_per_node(self.cluster.nodes).items():
                free[node] -= devices
        return free

    @cached_property
    def num_bound_jobs(self) -> dict[WorkerGroupId, int]:
        """Jobs with at least one copy bound to each worker group."""
        count = dict.fromkeys(self.cluster.worker_groups, 0)
        for job in self.jobs.values():
            for wg in set(job.bindings.values()):
                count[wg] += 1
        return count

    @cached_property
    def quiet_groups(self) -> "QuietGroups":
        """The worker groups known to plan to nothing on this Snapshot, and when (a memo
        ``planner.plan`` fills; ``carry`` hands it on, less the groups a change touched)."""
        return QuietGroups(set(self.group_order), {})


ALWAYS = (-math.inf, math.inf)   #: the times of a group quiet whatever the time


@dataclass
class QuietGroups:
    """Groups whose plan is known to be empty on one Snapshot, at ``now`` in [since, until).

    Everything not in ``unknown`` is quiet always unless ``windows`` gives its times. A memo,
    never a source of truth: a group is only left out of ``unknown`` once the planner has
    found it quiet on this Snapshot, or on an earlier one no change since has touched.
    ``span`` (the latest since, the earliest until) may be narrower than the windows' own,
    never wider: inside it no window has lapsed.
    """

    unknown: set[WorkerGroupId]
    windows: dict[WorkerGroupId, tuple[float, float]]
    span: tuple[float, float] = ALWAYS

    def record(self, wg: WorkerGroupId, since: float, until: float) -> None:
        self.unknown.discard(wg)
        if (since, until) == ALWAYS:
            self.windows.pop(wg, None)
        else:
            self.windows[wg] = (since, until)
            self.span = (max(self.span[0], since), min(self.span[1], until))

    def to_plan(self, now: float) -> list[WorkerGroupId]:
        """The groups a plan at ``now`` must visit, in planning order."""
        if self.span[0] <= now < self.span[1]:
            return sorted(self.unknown)
        self.span = (max((s for s, _ in self.windows.values()), default=-math.inf),
                     min((u for _, u in self.windows.values()), default=math.inf))
        lapsed = [wg for wg, (since, until) in self.windows.items() if not since <= now < until]
        return sorted(self.unknown.union(lapsed))

    def without(self, groups: set[WorkerGroupId]) -> "QuietGroups":
        """The memo once ``groups`` may have changed."""
        windows = dict(self.windows)
        for wg in groups:
            windows.pop(wg, None)
        return QuietGroups(self.unknown | groups, windows, self.span)
