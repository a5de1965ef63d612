"""Expected costs: the seconds a transition and a call will take.

Owns: the two estimators the policies use, ``transfer_s`` and ``service_s``, read off the
tables the Snapshot has learned (``estimates.py``). A warm job is estimated from its own
history; a cold one from its ModelSpec and the nominal hardware figures (docs/design.md,
"Cold and warm costs").
Must not know: where observations come from, or any clock.
"""

from __future__ import annotations

from plexrl.core.cluster import ClusterSpec, Direction
from plexrl.core.snapshot import CallView, Snapshot
from plexrl.protocol import Function, Tier, WorkerGroupId

#: Cold-start assumptions (docs/design.md): training MFU and decode efficiency guesses.
COLD_MFU = 0.3
COLD_DECODE_BATCH = 64
FLOPS_PER_TOKEN = {Function.FORWARD_BACKWARD: 6.0, Function.LOGPROBS: 2.0}


def lane_bytes(cluster: ClusterSpec, wg: WorkerGroupId, direction: Direction,
               num_bytes: float) -> float:
    """Bytes one lane carries: device links move a share per device, disks a share per node."""
    spec = cluster.worker_groups[wg]
    lanes = spec.num_devices if direction in (Direction.ONLOAD, Direction.OFFLOAD) else len(spec.nodes)
    return num_bytes / max(1, lanes)


def transfer_s(snap: Snapshot, wg: WorkerGroupId, src: Tier, dst: Tier, num_bytes: float) -> float:
    """Expected seconds of one transition, at the learned bandwidth (else the nominal one)."""
    node = snap.cluster.node_of(wg)
    learned = {d: snap.estimates.bytes_per_s.get((node.node, d)) or bw
               for d, bw in node.bytes_per_s.items()}
    return transition_s(snap.cluster, wg, src, dst, num_bytes, learned)


def transition_s(cluster: ClusterSpec, wg: WorkerGroupId, src: Tier, dst: Tier, num_bytes: float,
                 bytes_per_s: dict[Direction, float]) -> float:
    """Seconds of one transition at the given bandwidths: 0 for a drop, the fixed latency only
    for a KV rebuild, else latency + the bytes of one lane / that lane's bandwidth."""
    direction = Direction.of(src, dst)
    latency_s = cluster.node_of(wg).move_latency_s
    if direction is None:
        return latency_s if dst == Tier.DEVICE else 0.0
    return latency_s + lane_bytes(cluster, wg, direction, num_bytes) / bytes_per_s[direction]


def service_s(snap: Snapshot, call: CallView) -> float:
    """Expected service time of a call: its job's history if any, else a cold estimate."""
    warm = snap.estimates.service_s.get((call.job, call.function))
    if warm is not None:
        return warm
    return cold_service_s(snap, call)


def cold_service_s(snap: Snapshot, call: CallView) -> float:
    """A spec-only estimate (docs/design.md): FLOPs at an assumed MFU, decode at an assumed batch."""
    spec = snap.jobs[call.job].spec.model(call.role).spec
    group = snap.cluster.worker_groups[call.wg]
    device = snap.cluster.device_of(call.wg)
    tokens = max(1, call.num_tokens)
    if call.function == Function.GENERATE:
        instances = max(1, group.num_devices // spec.rollout_tp)
        step_s = spec.dtype_bytes * spec.active_params / spec.rollout_tp / device.hbm_bytes_per_s
        return tokens * step_s / (COLD_DECODE_BATCH * instances)
    if call.function in FLOPS_PER_TOKEN:
        flops = FLOPS_PER_TOKEN[call.function] * spec.active_params * tokens
        return flops / (COLD_MFU * device.peak_flops * group.num_devices)
    # optimizer step, sync, save, load: bound by reading the weights once per device
    return spec.dtype_bytes * spec.total_params / group.num_devices / device.hbm_bytes_per_s
