"""Memory accounting: bytes held on each worker group's devices and each node's host memory.

Owns the one definition of "used" that planning and the invariant checker share: a State
counts on every tier it occupies, so an in-flight transition counts at both ends until it
finishes, and a running call's workspace counts on its worker group. Must not know: policies.
"""

from __future__ import annotations

from plexrl.core.snapshot import Snapshot
from plexrl.protocol import NodeId, WorkerGroupId


def device_used(snap: Snapshot, wg: WorkerGroupId) -> int:
    """Bytes held on a worker group's devices: States there or arriving, plus running workspace."""
    call = snap.running.get(wg)
    return snap.device_state_bytes[wg] + (call.workspace_bytes if call else 0)


def device_free(snap: Snapshot, wg: WorkerGroupId) -> float:
    return snap.cluster.device_budget(wg) - device_used(snap, wg)


def host_used(snap: Snapshot) -> dict[NodeId, float]:
    """Bytes of host memory held per node; a group's parked States spread over its nodes."""
    return dict(snap.host_state_bytes)


def host_capacity(snap: Snapshot, wg: WorkerGroupId) -> float:
    """Host bytes a worker group can park when nothing else is parked (its tightest node decides)."""
    nodes = snap.cluster.worker_groups[wg].nodes
    return min(snap.cluster.nodes[n].host_bytes for n in nodes) * len(nodes)


def host_room(snap: Snapshot, wg: WorkerGroupId, used: dict[NodeId, float] | None = None) -> float:
    """Bytes a worker group can still park on host memory (its tightest node decides)."""
    nodes = snap.cluster.worker_groups[wg].nodes
    used_on = snap.host_bytes_on if used is None else used.__getitem__
    return min(snap.cluster.nodes[n].host_bytes - used_on(n) for n in nodes) * len(nodes)
