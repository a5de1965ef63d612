"""The runtime's settings: emulated devices, worker groups, threads, and scheduling knobs.

Owns: ``RuntimeConfig`` and ``WorkerGroupConfig`` (frozen, with units; loadable from TOML
through ``plexrl.config``), and ``cluster_spec``: the ``ClusterSpec`` the core plans against,
once the worker groups have their nodes. Must not know: Ray, torch, or how a call runs.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass

from plexrl.config import check_options, option
from plexrl.core.cluster import ClusterSpec, DeviceSpec, Direction, NodeSpec, WorkerGroupSpec
from plexrl.core.snapshot import CoreConfig
from plexrl.errors import ConfigError
from plexrl.protocol import NodeId, WorkerGroupId


@dataclass(frozen=True)
class WorkerGroupConfig:
    name: str = option(doc="worker group id")
    num_devices: int = option(1, unit="count", min=1, doc="devices reserved for the group")
    purpose: str = option("any", choices=("any", "train", "rollout"),
                          doc="which model copies it hosts: any, trainer copies (train) or "
                              "rollout copies (rollout)")


@dataclass(frozen=True)
class RuntimeConfig:
    """What a local runtime starts with. Without CUDA every device is emulated: a byte
    budget in the service actor's memory (docs/design.md, "Emulated devices")."""

    device_bytes: int = option(256 << 20, unit="bytes", min=1,
                               doc="memory of one (emulated) device")
    host_bytes: int = option(4 << 30, unit="bytes", min=1,
                             doc="host memory for parked states, per node")
    worker_groups: tuple[WorkerGroupConfig, ...] = option(
        (WorkerGroupConfig("wg0", 1),), doc="worker groups, each on one node")
    threads: int = option(1, unit="count", min=1, doc="torch threads of each service actor")
    device_cores: tuple[int, ...] = option(
        (), unit="count", min=0, doc="emulated devices: the CPU cores services compute on, `threads` per worker "
        "group in order, kept for them by plexrl.runtime.workers.cores.reserve; empty: not pinned")
    group_spread: str = option("spread", choices=("spread", "strict-spread", "pack"),
                               doc="how worker groups spread over the Ray cluster's nodes")
    queue_policy: str = option("hrrs", choices=("hrrs", "fcfs", "round-robin"))
    prefetch: bool = option(True, doc="onload the next call's states while one runs")
    pipeline: bool = option(True, doc="send a service its next call while one runs, once the "
                            "next one's states are resident, so it starts without a round trip")
    pipeline_lead_s: float = option(0.005, unit="s", min=0.0,
                                    doc="how long before the running call's expected end")
    host_root: str = option("/dev/shm", doc="directory of shared-memory host copies")
    disk_bytes: int = option(64 << 30, unit="bytes", min=0,
                             doc="disk for spilled states, per node (the core plans against it)")
    spill_root: str = option(tempfile.gettempdir(),
                             doc="directory of spill files; each session makes its own under it")
    check_invariants: bool = option(False, doc="check the core's invariants every cycle (tests)")
    skip_onload: tuple[str, ...] = option(
        (), doc="fault injection for tests: States whose onload copies no bytes (zeroed)")
    fail_at: tuple[str, ...] = option(
        (), doc="fault injection for tests: store failure points, each fires once (tiers/store.py)")
    bytes_per_s: float = option(8e9, unit="bytes/s", min=1,
                                doc="nominal host<->device copy rate, until measured")
    lease_s: float = option(30.0, unit="s", min=0.1,
                            doc="a job whose driver is silent this long is ended and freed")
    state_dir: str = option("", doc="the controller's journal and checkpoints; empty: a "
                            "directory of the session's own, removed when it shuts down")
    engine: str = option("torch", choices=("torch", "simulated"),
                         doc="what services run calls with: torch models, or simulated "
                         "engines that sleep and answer small deterministic arrays (load tests)")
    sim_call_s: float = option(0.002, unit="s", min=0.0,
                               doc="simulated engine: seconds one call takes")
    recent_calls: int = option(256, unit="count", min=1,
                               doc="calls each service remembers, to answer a repeat")
    call_log_limit: int = option(50_000, unit="count", min=1,
                                 doc="finished calls the controller keeps for inspect('calls'), "
                                 "metrics and the dashboard; older ones are dropped")
    observe_host: str = option("127.0.0.1", doc="address of the metrics and dashboard server "
                                                "(loopback unless told otherwise)")
    observe_port: int = option(0, unit="count", min=0, max=65535,
                               doc="its port; 0: one the OS picks (inspect('endpoints') says)")
    tinker_port: int = option(0, unit="count", min=0, max=65535,
                              doc="port of the Tinker API server, on observe_host; 0: one the "
                                  "OS picks (inspect('endpoints')['tinker'])")
    tinker_api_keys: tuple[str, ...] = option((), doc="API keys the Tinker server accepts "
                                              "(each a tenant); empty: any key starting tml-")
    tinker_models: tuple[str, ...] = option((), doc="local Hugging Face checkpoint directories "
                                            "the Tinker API serves as base models, besides the "
                                            "built-in tiny configs")

    @property
    def num_devices(self) -> int:
        return sum(g.num_devices for g in self.worker_groups)

    def __post_init__(self):
        check_options(self)
        if self.device_cores and len(self.device_cores) != self.threads * len(self.worker_groups):
            raise ConfigError(f"{len(self.device_cores)} device cores for "
                              f"{len(self.worker_groups)} worker groups of {self.threads} threads",
                              field="device_cores", value=self.device_cores,
                              fix="give `threads` cores per worker group, or none")

    def cores_of(self, index: int) -> tuple[int, ...]:
        """The cores the ``index``-th worker group's service computes on (``()``: any)."""
        return self.device_cores[index * self.threads:(index + 1) * self.threads]

    def core_config(self) -> CoreConfig:
        return CoreConfig(queue_policy=self.queue_policy, prefetch=self.prefetch,
                          pipeline=self.pipeline, pipeline_lead_s=self.pipeline_lead_s,
                          backfill=False)


EMULATED = DeviceSpec(name="emulated", memory_bytes=0, usable_frac=1.0, peak_flops=1e11,
                      hbm_bytes_per_s=1e10)


def cluster_spec(config: RuntimeConfig, nodes: dict[str, str]) -> ClusterSpec:
    """The cluster the core plans against: each worker group of ``config`` on the Ray node
    ``nodes`` names for it; a node holds the devices of its groups and ``host_bytes``."""
    device = DeviceSpec(name=EMULATED.name, memory_bytes=config.device_bytes, usable_frac=1.0,
                        peak_flops=EMULATED.peak_flops, hbm_bytes_per_s=EMULATED.hbm_bytes_per_s)
    rates = {Direction.ONLOAD: config.bytes_per_s, Direction.OFFLOAD: config.bytes_per_s,
             Direction.SPILL: config.bytes_per_s / 4, Direction.RESTORE: config.bytes_per_s / 4}
    groups = {WorkerGroupId(g.name): WorkerGroupSpec(wg=WorkerGroupId(g.name),
                                                     nodes=(NodeId(nodes[g.name]),),
                                                     num_devices=g.num_devices,
                                                     purpose=g.purpose)
              for g in config.worker_groups}
    devices: dict[NodeId, int] = {}
    for group in groups.values():
        devices[group.nodes[0]] = devices.get(group.nodes[0], 0) + group.num_devices
    return ClusterSpec(nodes={node: NodeSpec(node=node, num_devices=count, device=device,
                                             host_bytes=config.host_bytes, disk_bytes=config.disk_bytes,
                                             bytes_per_s=rates)
                              for node, count in devices.items()},
                       worker_groups=groups)
