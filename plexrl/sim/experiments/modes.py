"""Deployment modes as layouts: which worker groups exist and which jobs may bind to them.

Owns: ``Sizes`` (GPUs per pool) and ``build_layout``, which turns (scenario, mode, the
workloads of an experiment, sizes, seed) into a ClusterSpec, each job's JobSpec and its
SimJob driver. A mode is a configuration, not a fork (DESIGN.md section 4):

- ``colocated``: each job alone on one pool; rollout and training take turns, on-policy.
- ``split-async``: each job has a rollout pool and a training pool, one step stale.
- ``plexrl``: each job has a private rollout pool; one training pool is time-sliced by the
  core across the experiment's jobs; one step stale, as the split-async baseline.
- ``plexrl-on-policy``: the same layout, on-policy, to compare with colocated.

Must not know: how the layout is simulated or charged.
"""

from __future__ import annotations

from dataclasses import dataclass

from plexrl.core.cluster import ClusterSpec, DeviceSpec, Direction, NodeSpec, WorkerGroupSpec
from plexrl.core.jobs import JobSpec
from plexrl.protocol import JobId, NodeId, WorkerGroupId
from plexrl.sim.experiments.job import SimJob
from plexrl.sim.scenario import ClusterConfig, Scenario

STALENESS = {"colocated": 0, "split-async": 1, "plexrl": 1, "plexrl-on-policy": 0}
SHARED_TRAIN = WorkerGroupId("train-shared")


@dataclass(frozen=True)
class Sizes:
    """GPUs of each pool of one job (the training pool is shared in plexrl modes)."""

    colocated_gpus: int
    split_rollout_gpus: int
    train_gpus: int
    plexrl_private_gpus: int

    def of(self, mode: str) -> dict[str, int]:
        if mode == "colocated":
            return {"colocated_gpus": self.colocated_gpus}
        if mode == "split-async":
            return {"rollout_gpus": self.split_rollout_gpus, "train_gpus": self.train_gpus}
        return {"private_rollout_gpus": self.plexrl_private_gpus, "shared_train_gpus": self.train_gpus}


@dataclass(frozen=True)
class Layout:
    cluster: ClusterSpec
    specs: dict[JobId, JobSpec]
    jobs: dict[JobId, SimJob]
    bound: dict[WorkerGroupId, list[JobId]]
    achieved_bytes_per_s: dict[Direction, float]


def job_id(index: int, workload: str) -> JobId:
    return JobId(f"j{index}-{workload}")


def build_layout(s: Scenario, mode: str, workloads: tuple[str, ...], sizes: Sizes, seed: int,
                 indexes: tuple[int, ...] | None = None) -> Layout:
    """The pools and jobs of one mode. ``indexes`` keeps a job's id and seed when run alone."""
    indexes = indexes if indexes is not None else tuple(range(len(workloads)))
    groups: dict[WorkerGroupId, tuple[int, str]] = {}
    specs, jobs, bound = {}, {}, {}
    for index, name in zip(indexes, workloads):
        job = job_id(index, name)
        rollout, train = _pools_of(mode, index, sizes, groups)
        w = s.workloads[name]
        jobs[job] = SimJob(job, w, s.models[w.model], s.cluster, staleness=STALENESS[mode],
                           num_steps=s.num_steps, seed=seed * 1000 + index,
                           workspace_frac=s.train_workspace_frac)
        specs[job] = jobs[job].spec((rollout,), (train,))
        for wg in dict.fromkeys((rollout, train)):
            bound.setdefault(wg, []).append(job)
    return Layout(_cluster(s.cluster, groups), specs, jobs, bound, achieved(s.cluster))


def _pools_of(mode: str, index: int, sizes: Sizes, groups: dict) -> tuple[WorkerGroupId, WorkerGroupId]:
    if mode == "colocated":
        wg = WorkerGroupId(f"coloc-{index}")
        groups[wg] = (sizes.colocated_gpus, "any")
        return wg, wg
    rollout = WorkerGroupId(f"rollout-{index}")
    if mode == "split-async":
        groups[rollout] = (sizes.split_rollout_gpus, "rollout")
        train = WorkerGroupId(f"train-{index}")
    else:
        groups[rollout] = (sizes.plexrl_private_gpus, "rollout")
        train = SHARED_TRAIN
    groups[train] = (sizes.train_gpus, "train")
    return rollout, train


def _cluster(c: ClusterConfig, groups: dict[WorkerGroupId, tuple[int, str]]) -> ClusterSpec:
    """Each pool on nodes of its own; host memory and disk prorated to the devices used."""
    nodes, wgs = {}, {}
    for wg, (num_devices, purpose) in groups.items():
        names = []
        for first in range(0, num_devices, c.devices_per_node):
            count = min(c.devices_per_node, num_devices - first)
            node = NodeId(f"{wg}/n{first // c.devices_per_node}")
            nodes[node] = _node(c, node, count)
            names.append(node)
        wgs[wg] = WorkerGroupSpec(wg, tuple(names), num_devices, purpose)
    return ClusterSpec(nodes, wgs)


def node_cluster(c: ClusterConfig, total_gpus: int) -> ClusterSpec:
    """Whole nodes and no worker groups yet: groups are cut at admission (a trace replay)."""
    if total_gpus % c.devices_per_node:
        raise ValueError(f"{total_gpus} GPUs are not whole nodes of {c.devices_per_node}")
    nodes = {}
    for i in range(total_gpus // c.devices_per_node):
        node = NodeId(f"n{i:04d}")
        nodes[node] = _node(c, node, c.devices_per_node)
    return ClusterSpec(nodes, {})


def _node(c: ClusterConfig, node: NodeId, count: int) -> NodeSpec:
    """A node of ``count`` devices; host memory and disk prorated to the devices it has."""
    device = DeviceSpec(c.gpu_name, c.device_memory_bytes, c.usable_frac, c.peak_flops,
                        c.hbm_bytes_per_s)
    nominal = {Direction.ONLOAD: c.nominal_onload_bytes_per_s,
               Direction.OFFLOAD: c.nominal_offload_bytes_per_s,
               Direction.SPILL: c.spill_bytes_per_s, Direction.RESTORE: c.restore_bytes_per_s}
    share = count / c.devices_per_node
    return NodeSpec(node, count, device, c.host_bytes_per_node * share, c.disk_bytes_per_node * share,
                    nominal, c.move_latency_s)


def achieved(c: ClusterConfig) -> dict[Direction, float]:
    return {Direction.ONLOAD: c.onload_bytes_per_s, Direction.OFFLOAD: c.offload_bytes_per_s,
            Direction.SPILL: c.spill_bytes_per_s, Direction.RESTORE: c.restore_bytes_per_s}
