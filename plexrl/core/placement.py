"""Placement: bind a submitted job's model copies to worker groups, and size rollout pools.

Owns: admission (``admit``: filter worker groups by purpose, device layout, device memory
and host memory, score by fewest bound jobs (``placement="spread"``) or most
(``"pack"``) then the largest budget, or ``Reject`` with the sizes when nothing can ever fit) and the rollout-pool sizing model (``RolloutDemand``, ``size_rollout_pool``):
the data-parallel degree of a job's private rollout allocation that minimises GPU-hours per
step. Must not know: queues, clocks, simulators.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from plexrl.core.decisions import Decision, Place, Reject
from plexrl.core.jobs import (JobSpec, ModelDecl, device_bytes_needed, pinned_to_host, state_bytes,
                              states_of)
from plexrl.core.snapshot import Snapshot
from plexrl.core.usage import host_capacity, host_room
from plexrl.protocol import Copy, State, WorkerGroupId

GiB = 2**30


def admit(snap: Snapshot, spec: JobSpec) -> list[Decision]:
    """Place every copy of a job, or reject it when some copy fits no candidate group at all.

    A job whose host-pinned States (ZeRO-offload optimizer) fit the host memory but not what
    is free of it now gets no decision: it stays pending until room is made.
    """
    decisions: list[Decision] = []
    for role, copy, groups in spec.candidates:
        decl = spec.model(role)
        fitting = _fitting(snap, spec, role, copy, groups)
        if not fitting:
            return [Reject(job=spec.job, reason=_no_fit_reason(snap, spec, decl, copy, groups))]
        roomy = [wg for wg, pinned in fitting if not pinned or pinned <= host_room(snap, wg)]
        if not roomy:
            return []
        bound = snap.num_bound_jobs
        sign = -1 if snap.config.placement == "pack" else 1
        taken: dict[WorkerGroupId, int] = {}   # this job's lanes already on each group
        for lane in range(spec.lanes(role, copy)):
            best = min(roomy, key=lambda wg: (taken.get(wg, 0), sign * bound[wg],
                                              -_budget(snap, wg), wg))
            taken[best] = taken.get(best, 0) + 1
            decisions.append(Place(job=spec.job, role=role, copy=copy, wg=best, lane=lane))
    return decisions


def _fitting(snap: Snapshot, spec: JobSpec, role, copy: Copy,
             groups: tuple[WorkerGroupId, ...]) -> list[tuple[WorkerGroupId, int]]:
    """The candidate groups a copy could ever fit, with its pinned bytes on each.

    Whether a copy fits depends only on the job's models and the group's shape (devices,
    purpose, device and host specs), so the answer is memoised per shape on the ClusterSpec
    (a changed cluster is a new ClusterSpec with an empty memo).
    """
    memo, out = snap.cluster.memo, []
    for wg in groups:
        key = (spec.placement_key, role, copy, _shape(snap, wg))
        if key not in memo:
            decl = spec.model(role)
            memo[key] = _pinned_bytes(snap, decl, copy, wg) if _fits(snap, decl, copy, wg) else None
        if memo[key] is not None:
            out.append((wg, memo[key]))
    return out


def _shape(snap: Snapshot, wg: WorkerGroupId) -> int:
    """A small number naming what fitting depends on: devices, purpose, device, host capacity."""
    memo = snap.cluster.memo
    if ("shape", wg) not in memo:
        group = snap.cluster.worker_groups[wg]
        shape = ("shape", group.num_devices, group.purpose, snap.cluster.device_of(wg),
                 host_capacity(snap, wg))
        memo[("shape", wg)] = memo.setdefault(shape, len(memo))
    return memo[("shape", wg)]


def _layout_ok(snap: Snapshot, decl: ModelDecl, copy: Copy, wg: WorkerGroupId) -> bool:
    group = snap.cluster.worker_groups[wg]
    unit = decl.spec.rollout_tp if copy == Copy.ROLLOUT else decl.spec.replica_devices
    wanted = "rollout" if copy == Copy.ROLLOUT else "train"
    return group.purpose in ("any", wanted) and group.num_devices % unit == 0


def _need_bytes(snap: Snapshot, decl: ModelDecl, copy: Copy, wg: WorkerGroupId) -> int:
    group = snap.cluster.worker_groups[wg]
    return device_bytes_needed(decl, copy, group.num_devices, snap.cluster.device_of(wg).usable_bytes)


def _pinned_bytes(snap: Snapshot, decl: ModelDecl, copy: Copy, wg: WorkerGroupId) -> int:
    """Bytes of the copy's States that live on HOST for good."""
    group = snap.cluster.worker_groups[wg]
    usable = snap.cluster.device_of(wg).usable_bytes
    return sum(state_bytes(decl, copy, s, group.num_devices, usable)
               for s in states_of(decl, copy) if pinned_to_host(decl, s))


def _fits(snap: Snapshot, decl: ModelDecl, copy: Copy, wg: WorkerGroupId) -> bool:
    """Device memory holds the copy's largest call; host memory can pass each State through."""
    return (_layout_ok(snap, decl, copy, wg)
            and _need_bytes(snap, decl, copy, wg) <= snap.cluster.device_budget(wg)
            and _parked_bytes(snap, decl, copy, wg) <= host_capacity(snap, wg))


def _parked_bytes(snap: Snapshot, decl: ModelDecl, copy: Copy, wg: WorkerGroupId) -> int:
    """Host bytes a copy needs at least: its pinned States and its largest other State, which
    must pass through host memory on its way to or from DISK."""
    group = snap.cluster.worker_groups[wg]
    usable = snap.cluster.device_of(wg).usable_bytes
    largest = max((state_bytes(decl, copy, s, group.num_devices, usable)
                   for s in states_of(decl, copy)
                   if s != State.KV_CACHE and not pinned_to_host(decl, s)), default=0)
    return largest + _pinned_bytes(snap, decl, copy, wg)


def _budget(snap: Snapshot, wg: WorkerGroupId) -> float:
    memo = snap.cluster.memo
    if ("budget", wg) not in memo:
        memo[("budget", wg)] = snap.cluster.device_budget(wg)
    return memo[("budget", wg)]


def _no_fit_reason(snap: Snapshot, spec: JobSpec, decl: ModelDecl, copy: Copy,
                   groups: tuple[WorkerGroupId, ...]) -> str:
    rows = []
    for wg in groups:
        group = snap.cluster.worker_groups[wg]
        if not _layout_ok(snap, decl, copy, wg):
            rows.append(f"{wg} ({group.num_devices} devices, purpose {group.purpose}) does not "
                        f"divide into {copy} instances of {decl.spec.name}")
        else:
            rows.append(f"{wg} " + " and ".join(_shortfalls(snap, decl, copy, wg)))
    listed = "; ".join(rows) if rows else "no candidate worker groups were given"
    return (f"job {spec.job}: {decl.role} {copy} copy of {decl.spec.name} fits no worker group: "
            f"{listed}. Fix: give it a larger worker group, more parallelism, or a smaller model")


def _shortfalls(snap: Snapshot, decl: ModelDecl, copy: Copy, wg: WorkerGroupId) -> list[str]:
    need, budget = _need_bytes(snap, decl, copy, wg), snap.cluster.device_budget(wg)
    parked, host = _parked_bytes(snap, decl, copy, wg), host_capacity(snap, wg)
    out = []
    if need > budget:
        out.append(f"needs {_size(need)} of device memory but has {_size(budget)}")
    if parked > host:
        out.append(f"needs {_size(parked)} of host memory to move its States "
                   f"but has {_size(host)}")
    return out


def _size(num_bytes: float) -> str:
    """GiB with one decimal; a size under 0.1 GiB (tiny test models) in MiB and bytes."""
    if num_bytes >= 0.1 * GiB:
        return f"{num_bytes / GiB:.1f} GiB"
    return f"{num_bytes / 2**20:.2f} MiB ({int(num_bytes)} bytes)"


@dataclass(frozen=True)
class RolloutDemand:
    """A job's rollout demand per step, from its spec or fitted from its history."""

    num_samples: int
    prompt_tokens: float
    mean_tokens: float           #: mean response length
    tail_tokens: float           #: longest response of a typical step
    devices_per_instance: int
    t0_s: float                  #: fixed cost of one decode step
    weight_read_s: float         #: seconds to read one instance's weights once
    kv_read_s_per_token: float   #: seconds to read one token of context on one instance
    max_live_tokens: float       #: KV capacity of one instance, tokens
    rest_of_step_s: float        #: seconds of the step the rollout pool does not overlap
    shared_devices: float        #: devices of shared pools charged to the job per step


def rollout_s(d: RolloutDemand, num_instances: int) -> float:
    """Estimated rollout makespan on ``num_instances`` instances: throughput or tail bound."""
    per_instance = math.ceil(d.num_samples / num_instances)
    live = max(1.0, min(per_instance, d.max_live_tokens / (d.prompt_tokens + d.mean_tokens)))
    ctx = live * (d.prompt_tokens + d.mean_tokens / 2)
    step = d.t0_s + d.weight_read_s + ctx * d.kv_read_s_per_token
    throughput_s = per_instance * d.mean_tokens / live * step
    tail_step = d.t0_s + d.weight_read_s + (d.prompt_tokens + d.tail_tokens / 2) * d.kv_read_s_per_token
    return max(throughput_s, d.tail_tokens * tail_step)


def size_rollout_pool(d: RolloutDemand, choices: tuple[int, ...]) -> int:
    """The instance count (of ``choices``) with the fewest GPU-hours per step."""
    def cost(n: int) -> tuple[float, int]:
        step_s = max(rollout_s(d, n), 0.0) + d.rest_of_step_s
        return ((n * d.devices_per_instance + d.shared_devices) * step_s, n)
    return min(choices, key=cost)
