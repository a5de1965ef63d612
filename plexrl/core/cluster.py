"""The cluster model the core plans against: devices, nodes, worker groups, bandwidths.

Owns: the static description of hardware (``DeviceSpec``, ``NodeSpec``) and of the fixed
device sets that execute calls (``WorkerGroupSpec``), and the transfer ``Direction``s.
Must not know: how a transfer is really done, or any clock.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import cached_property

from plexrl.protocol import NodeId, Tier, WorkerGroupId


class Direction(enum.StrEnum):
    """A transfer direction between tiers; each has its own learned bandwidth."""

    ONLOAD = "onload"      # HOST -> DEVICE
    OFFLOAD = "offload"    # DEVICE -> HOST
    SPILL = "spill"        # HOST -> DISK
    RESTORE = "restore"    # DISK -> HOST

    @staticmethod
    def of(src: Tier, dst: Tier) -> "Direction | None":
        """The direction of a tier change; None for a drop or a rebuild (no bytes move)."""
        return _DIRECTIONS.get((src, dst))


_DIRECTIONS = {
    (Tier.HOST, Tier.DEVICE): Direction.ONLOAD,
    (Tier.DEVICE, Tier.HOST): Direction.OFFLOAD,
    (Tier.HOST, Tier.DISK): Direction.SPILL,
    (Tier.DISK, Tier.HOST): Direction.RESTORE,
}


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator."""

    name: str
    memory_bytes: float          #: HBM capacity, bytes
    usable_frac: float           #: share of HBM an engine may use (the rest: runtime, fragmentation)
    peak_flops: float            #: dense bf16 FLOP/s
    hbm_bytes_per_s: float       #: memory bandwidth, bytes/s

    @property
    def usable_bytes(self) -> float:
        return self.memory_bytes * self.usable_frac


@dataclass(frozen=True)
class NodeSpec:
    """One machine. Device-side bandwidths are per device; disk bandwidths per node."""

    node: NodeId
    num_devices: int
    device: DeviceSpec
    host_bytes: float                       #: host DRAM usable for parked states, bytes
    disk_bytes: float                       #: spill capacity, bytes
    bytes_per_s: dict[Direction, float] = field(default_factory=dict)  #: nominal, per direction
    move_latency_s: float = 0.0             #: fixed cost of one transition (setup, sync), s


@dataclass(frozen=True)
class WorkerGroupSpec:
    """A fixed set of devices that executes one call at a time (the paper's WPG)."""

    wg: WorkerGroupId
    nodes: tuple[NodeId, ...]    #: nodes its devices sit on; host copies are spread over them
    num_devices: int
    purpose: str = "any"         #: "rollout", "train" or "any": which copies it may host
    pool: str = ""               #: carved groups: the pool class later jobs may share ("": private)
    carved: bool = False         #: cut from free devices at admission, released with its last job

    def devices_per_node(self, nodes: dict[NodeId, "NodeSpec"]) -> dict[NodeId, int]:
        """Devices it holds on each of its nodes: filling them in order (a cut group is even)."""
        out, left = {}, self.num_devices
        for node in self.nodes:
            out[node] = min(left, nodes[node].num_devices) if node != self.nodes[-1] else left
            left -= out[node]
        return out


@dataclass(frozen=True)
class ClusterSpec:
    """Nodes and worker groups, by id."""

    nodes: dict[NodeId, NodeSpec]
    worker_groups: dict[WorkerGroupId, WorkerGroupSpec]
    #: answers of pure functions of this cluster's specs (placement fits), filled on use
    memo: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    @cached_property
    def total_devices(self) -> int:
        return sum(n.num_devices for n in self.nodes.values())

    @cached_property
    def node_size(self) -> int:
        """Devices of the largest node."""
        return max(n.num_devices for n in self.nodes.values())

    def device_of(self, wg: WorkerGroupId) -> DeviceSpec:
        return self.nodes[self.worker_groups[wg].nodes[0]].device

    def device_budget(self, wg: WorkerGroupId) -> float:
        """Bytes of usable device memory of a worker group, all its devices together."""
        spec = self.worker_groups[wg]
        return self.device_of(wg).usable_bytes * spec.num_devices

    def node_of(self, wg: WorkerGroupId) -> NodeSpec:
        return self.nodes[self.worker_groups[wg].nodes[0]]

    def with_group(self, spec: WorkerGroupSpec) -> "ClusterSpec":
        return ClusterSpec(self.nodes, {**self.worker_groups, spec.wg: spec})

    def without_groups(self, ids: set[WorkerGroupId]) -> "ClusterSpec":
        return ClusterSpec(self.nodes, {w: g for w, g in self.worker_groups.items() if w not in ids})
