"""Two worker groups on two nodes of a local multi-node Ray cluster (run in its own process by
``tests/runtime/test_multinode.py``: the cluster utility cannot share a process with the
session cluster). Object stores are capped at 100 MB."""

from __future__ import annotations

import os
from urllib.parse import unquote

import pytest
import ray
from ray.cluster_utils import Cluster

import grpo_like
from plexrl.client import Runtime
from plexrl.errors import ServiceLost
from plexrl.runtime.config import RuntimeConfig, WorkerGroupConfig
from plexrl.runtime.models import model_spec
from plexrl.runtime.transport import NAMESPACE, RayTransport

SPEC = model_spec("policy", source="tiny-qwen2")
NODE = {"num_cpus": 1, "resources": {"plexrl_device": 2}, "object_store_memory": 100 << 20}


@pytest.fixture(scope="module")
def cluster():
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    cluster = Cluster(initialize_head=True, head_node_args=NODE)
    worker = cluster.add_node(**NODE)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, namespace=NAMESPACE, logging_level="WARNING")
    yield cluster, worker
    ray.shutdown()
    cluster.shutdown()


def _files_by_job(root):
    """The jobs whose HOST copies are under each worker group's directory."""
    out = {}
    for node in root.iterdir():
        for group in node.iterdir():
            named = group / "named"
            jobs = {unquote(p.name).split("/")[0] for p in named.iterdir()} if named.exists() else set()
            out[(node.name, group.name)] = jobs
    return out


def test_two_groups_on_two_nodes_keep_their_jobs_states_and_fail_alone(cluster):
    cluster, worker = cluster
    config = RuntimeConfig(worker_groups=(WorkerGroupConfig("wg0", 1), WorkerGroupConfig("wg1", 1)),
                           group_spread="strict-spread", check_invariants=True)
    runtime = Runtime(RayTransport(config=config))
    nodes = runtime.transport.info["nodes"]
    assert len(set(nodes.values())) == 2                        # one group per node
    jobs = {name: runtime.register_job(name, {"policy": SPEC}, seed=i)
            for i, name in enumerate(("a", "b"))}
    group_of = {job: next(iter(set(groups.values())))
                for job, groups in runtime.inspect("status")["jobs"].items()}
    assert set(group_of.values()) == {"wg0", "wg1"}             # each job bound to its own group
    for job in jobs.values():
        grpo_like.step(job, 0)

    moves = runtime.inspect("transitions")
    assert moves and all(m["wg"] == group_of[m["job"]] for m in moves)  # moved only at home
    root = runtime.transport.host_dir("wg0").parents[1]
    for (node, wg), owners in _files_by_job(root).items():
        assert node == nodes[wg] and owners <= {j for j, g in group_of.items() if g == wg}

    remote = next(job for job, wg in group_of.items() if nodes[wg] == worker.node_id)
    local = next(job for job in jobs if job != remote)
    cluster.remove_node(worker)                                 # the worker node is lost
    with pytest.raises(ServiceLost, match=group_of[remote]):
        grpo_like.step(jobs[remote], 1)
    assert grpo_like.step(jobs[local], 1)["tokens"].shape == (4, grpo_like.MAX_TOKENS)
    runtime.close()
