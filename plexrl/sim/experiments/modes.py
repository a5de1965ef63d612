"""Deployment modes as layouts: which worker groups exist and which jobs may bind to them.

Owns: ``Sizes`` (GPUs per pool) and ``build_layout``, which turns (scenario, mode, the
workloads of an experiment, sizes, seed) into a ClusterSpec, each job's JobSpec and its
SimJob driver. A mode is a configuration, not a fork (DESIGN.md section 4):

- ``colocated``: each job alone on one pool; rollout and training take turns, on-policy.
- ``split-async``: each job has a rollout pool and a training pool, one step stale.
- ``plexrl``: each job has a private rollout pool; one training pool is time-sliced by the
  core across the experiment's jobs; one step stale, as the split-async baseline.
- ``plexrl-on-policy``: the same layout, on-policy, to compare with colocated.
- ``plexrl-shared``: no private pools. The experiment's jobs share a rollout fleet of small
  worker groups: each job's rollout copy is split into lanes, one per fleet group it is
  bound to, and each step's batch is split over its lanes; a fleet group holds lanes of
  several jobs and the core time-slices it. One training pool is shared as in ``plexrl``.
  One step stale, to compare with split-async (D202, D203).
- ``plexrl-shared-on-policy``: the same layout, on-policy, to compare with colocated.

Must not know: how the layout is simulated or charged.
"""

from __future__ import annotations

from dataclasses import dataclass

from plexrl.core.cluster import ClusterSpec, DeviceSpec, Direction, NodeSpec, WorkerGroupSpec
from plexrl.core.jobs import JobSpec
from plexrl.protocol import JobId, NodeId, WorkerGroupId
from plexrl.sim.experiments.job import SimJob
from plexrl.sim.scenario import ClusterConfig, Scenario

STALENESS = {"colocated": 0, "split-async": 1, "plexrl": 1, "plexrl-on-policy": 0,
             "plexrl-shared": 1, "plexrl-shared-on-policy": 0}
FLEET_MODES = ("plexrl-shared", "plexrl-shared-on-policy")
SHARED_TRAIN = WorkerGroupId("train-shared")


@dataclass(frozen=True)
class Sizes:
    """GPUs of each pool of one job (the training pool is shared in plexrl modes); the fleet
    modes' rollout fleet is ``fleet_gpus`` per job in groups of ``fleet_group_gpus``, beside
    one training pool of ``shared_train_gpus`` (0: ``train_gpus``) for all the jobs."""

    colocated_gpus: int
    split_rollout_gpus: int
    train_gpus: int
    plexrl_private_gpus: int
    fleet_gpus: int = 0
    fleet_group_gpus: int = 0
    shared_train_gpus: int = 0
    fleet_tenants: int = 0       #: jobs with a lane on each fleet group (0: every job)

    def of(self, mode: str) -> dict[str, int]:
        if mode == "colocated":
            return {"colocated_gpus": self.colocated_gpus}
        if mode == "split-async":
            return {"rollout_gpus": self.split_rollout_gpus, "train_gpus": self.train_gpus}
        if mode in FLEET_MODES:
            return {"fleet_gpus_per_job": self.fleet_gpus, "fleet_group_gpus": self.fleet_group_gpus,
                    "fleet_tenants": self.fleet_tenants,
                    "shared_train_gpus": self.shared_train_gpus or self.train_gpus}
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
    if mode in FLEET_MODES:
        return _fleet_layout(s, mode, workloads, sizes, seed, indexes)
    groups: dict[WorkerGroupId, tuple[int, str]] = {}
    specs, jobs, bound = {}, {}, {}
    for index, name in zip(indexes, workloads):
        job = job_id(index, name)
        rollout, train = _pools_of(mode, index, sizes, groups)
        jobs[job] = _sim_job(s, mode, job, name, seed, index)
        specs[job] = jobs[job].spec((rollout,), (train,))
        for wg in dict.fromkeys((rollout, train)):
            bound.setdefault(wg, []).append(job)
    return Layout(_cluster(s.cluster, groups), specs, jobs, bound, achieved(s.cluster))


def _sim_job(s: Scenario, mode: str, job: JobId, name: str, seed: int, index: int,
             lanes: int = 1) -> SimJob:
    w = s.workloads[name]
    return SimJob(job, w, s.models[w.model], s.cluster, staleness=STALENESS[mode],
                  num_steps=s.num_steps, seed=seed * 1000 + index,
                  workspace_frac=s.train_workspace_frac, lanes=lanes)


def fleet_group_gpus(s: Scenario, workloads: tuple[str, ...], sizes: Sizes) -> int:
    """Devices of one fleet group: as sized, else one rollout instance of the model."""
    return sizes.fleet_group_gpus or s.models[s.workloads[workloads[0]].model].rollout_tp


def fleet_tenants(sizes: Sizes, num_jobs: int) -> int:
    """Jobs with a lane on each fleet group: as sized (0: every job), at most ``num_jobs``."""
    return min(num_jobs, sizes.fleet_tenants or num_jobs)


def fleet_groups(sizes: Sizes, num_jobs: int, group_gpus: int) -> int:
    """Groups of the rollout fleet: every job's share of it, in whole groups."""
    return max(1, num_jobs * sizes.fleet_gpus // group_gpus)


def _fleet_layout(s: Scenario, mode: str, workloads: tuple[str, ...], sizes: Sizes, seed: int,
                  indexes: tuple[int, ...]) -> Layout:
    """A rollout fleet of small groups and one training pool, shared by all the jobs.

    Each job has as many lanes as make ``fleet_tenants`` jobs per group; the core's
    placement spreads them over the fleet, so a group freed by one job's chunk serves
    another job's (D203). A job run alone keeps its own share of the fleet."""
    group_gpus = fleet_group_gpus(s, workloads, sizes)
    count = fleet_groups(sizes, len(workloads), group_gpus)
    groups = {WorkerGroupId(f"fleet-{i:03d}"): (group_gpus, "rollout") for i in range(count)}
    groups[SHARED_TRAIN] = (sizes.shared_train_gpus or sizes.train_gpus, "train")
    fleet = tuple(wg for wg in groups if wg != SHARED_TRAIN)
    specs, jobs = {}, {}
    tenants = fleet_tenants(sizes, len(workloads))
    lanes = max(1, -(-count * tenants // len(workloads)))
    for index, name in zip(indexes, workloads):
        job = job_id(index, name)
        jobs[job] = _sim_job(s, mode, job, name, seed, index, lanes=lanes)
        specs[job] = jobs[job].spec(fleet, (SHARED_TRAIN,))
    bound = {wg: [] for wg in groups}   # as the core places the lanes: see Trace.bound
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
