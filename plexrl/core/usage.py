"""Memory accounting: bytes held on each worker group's devices and each node's host memory.

Owns the one definition of "used" that planning and the invariant checker share: a State
counts on every tier it occupies, so an in-flight transition counts at both ends until it
finishes, and a running call's workspace counts on its worker group. Must not know: policies.
"""

from __future__ import annotations

from plexrl.core.snapshot import Snapshot, StateView
from plexrl.protocol import NodeId, Tier, WorkerGroupId


def occupies(view: StateView, tier: Tier) -> bool:
    return view.tier == tier or view.moving_to == tier


def device_used(snap: Snapshot, wg: WorkerGroupId) -> int:
    """Bytes held on a worker group's devices: States there or arriving, plus running workspace."""
    used = sum(s.num_bytes for s in snap.states.values() if s.wg == wg and occupies(s, Tier.DEVICE))
    call = snap.running.get(wg)
    return used + (call.workspace_bytes if call else 0)


def device_free(snap: Snapshot, wg: WorkerGroupId) -> float:
    return snap.cluster.device_budget(wg) - device_used(snap, wg)


def host_used(snap: Snapshot) -> dict[NodeId, float]:
    """Bytes of host memory held per node; a group's parked States spread over its nodes."""
    used = {node: 0.0 for node in snap.cluster.nodes}
    for view in snap.states.values():
        if occupies(view, Tier.HOST):
            nodes = snap.cluster.worker_groups[view.wg].nodes
            for node in nodes:
                used[node] += view.num_bytes / len(nodes)
    return used


def host_room(snap: Snapshot, wg: WorkerGroupId, used: dict[NodeId, float] | None = None) -> float:
    """Bytes a worker group can still park on host memory (its tightest node decides)."""
    used = host_used(snap) if used is None else used
    nodes = snap.cluster.worker_groups[wg].nodes
    return min(snap.cluster.nodes[n].host_bytes - used[n] for n in nodes) * len(nodes)
