"""The one executor of the runtime: worker groups reserved on Ray, and decisions as actor calls.

Owns: reserving the worker groups with one Ray placement group (a bundle of each group's
devices, so a group sits on one node: GPUs where the cluster has them, else the
``plexrl_device`` resource that stands for an emulated device), spread over the nodes,
starting one service actor per group inside its bundle, on that node, and turning
``Dispatch`` / ``Move`` / binding into calls on that actor, each answered by an object
reference. The reservation and the service actors are detached and named by session, so they
outlive a controller that dies: its restart finds them again (``attach``).
Must not know: why a decision was made, or what a call computes.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import ray
from ray.util.placement_group import (placement_group, placement_group_table,
                                      remove_placement_group)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from plexrl.core.decisions import Move
from plexrl.errors import ConfigError
from plexrl.protocol import WorkerGroupId
from plexrl.runtime.config import RuntimeConfig
from plexrl.runtime.workers.order import CallOrder
from plexrl.runtime.workers.actor import ServiceActor

DEVICE_RESOURCE = "plexrl_device"   #: the Ray resource of one emulated device
_STRATEGIES = {"spread": "SPREAD", "strict-spread": "STRICT_SPREAD", "pack": "PACK"}
READY_TIMEOUT_S = 60.0


class Executor:
    def __init__(self, services: dict[WorkerGroupId, object], nodes: dict[WorkerGroupId, str],
                 reservation, host_root: Path, spill_root: Path):
        self.services = services
        self.nodes = nodes           #: the Ray node each worker group sits on
        self._reservation = reservation
        self._host_root, self._spill_root = host_root, spill_root

    @classmethod
    async def start(cls, config: RuntimeConfig, session: str) -> "Executor":
        """Reserve every worker group (one bundle of its devices each, spread over the nodes
        as ``config.group_spread`` says) and start its service actor on the node it got;
        wait until all answer."""
        resource = "GPU" if ray.cluster_resources().get("GPU") else DEVICE_RESOURCE
        bundles = [{resource: g.num_devices} for g in config.worker_groups]
        pg = placement_group(bundles, strategy=_STRATEGIES[config.group_spread],
                             name=f"plexrl-{session}-groups", lifetime="detached")
        try:
            await asyncio.wait_for(pg.ready(), READY_TIMEOUT_S)
        except asyncio.TimeoutError:
            remove_placement_group(pg)
            have = ray.cluster_resources().get(resource, 0)
            raise ConfigError(
                f"the worker groups could not reserve {[b[resource] for b in bundles]} {resource} "
                f"({config.group_spread}) within {READY_TIMEOUT_S:.0f} s; the cluster has "
                f"{have:g}", field="worker_groups", value=[g.name for g in config.worker_groups],
                fix=f"start Ray with resources={{'{resource}': N}} on enough nodes, or ask for "
                "fewer devices") from None
        placed = placement_group_table(pg)["bundles_to_node_id"]
        actor = ray.remote(ServiceActor)
        services, nodes = {}, {}
        host_root = Path(config.host_root) / f"plexrl-{session}"
        spill_root = Path(config.spill_root) / f"plexrl-{session}"
        for index, group in enumerate(config.worker_groups):
            wg = WorkerGroupId(group.name)
            nodes[wg] = placed[index]
            services[wg] = actor.options(
                name=f"plexrl-{session}-service-{group.name}", num_cpus=0, lifetime="detached",
                num_gpus=group.num_devices if resource == "GPU" else 0,
                resources={resource: group.num_devices} if resource != "GPU" else {},
                max_concurrency=1000,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, index),
                runtime_env={"env_vars": {"OMP_NUM_THREADS": str(config.threads)}},
            ).remote(group.name, config.device_bytes * group.num_devices,
                     str(host_root / nodes[wg] / group.name), config.threads, config.skip_onload,
                     str(spill_root / nodes[wg] / group.name), config.fail_at,
                     engine=config.engine, recent_calls=config.recent_calls,
                     call_s=config.sim_call_s, cores=config.cores_of(index))
        await asyncio.gather(*(s.ready.remote() for s in services.values()))
        return cls(services, nodes, pg, host_root, spill_root)

    @classmethod
    async def attach(cls, config: RuntimeConfig, session: str) -> "Executor":
        """The worker groups a previous controller of ``session`` started, found by name
        (a restarted controller); a group whose service is gone is left out."""
        pg = ray.util.get_placement_group(f"plexrl-{session}-groups")
        placed = placement_group_table(pg)["bundles_to_node_id"]
        services, nodes = {}, {}
        for index, group in enumerate(config.worker_groups):
            try:
                service = ray.get_actor(f"plexrl-{session}-service-{group.name}")
                await service.ping.remote()
            except (ValueError, ray.exceptions.RayActorError):
                continue
            services[WorkerGroupId(group.name)] = service
            nodes[WorkerGroupId(group.name)] = placed[index]
        return cls(services, nodes, pg, Path(config.host_root) / f"plexrl-{session}",
                   Path(config.spill_root) / f"plexrl-{session}")

    def bind(self, wg: WorkerGroupId, *args):
        return self.services[wg].bind.remote(*args)

    def dispatch(self, wg: WorkerGroupId, order: CallOrder):
        """Tell the service to run a call its job has sent it; answers a small record once
        the call ran (the job gets the result from the service itself)."""
        return self.services[wg].go.remote(order)

    def refuse(self, wg: WorkerGroupId, job: str, seq: int, err: Exception):
        return self.services[wg].fail.remote(job, seq, err)

    def moves(self, wg: WorkerGroupId, moves: list[Move]):
        """One call for the moves decided together on a group: the service runs them in order
        and answers a record or an error per move."""
        return self.services[wg].moves.remote([(m.key, m.src, m.dst, m.reason) for m in moves])

    def unbind(self, wg: WorkerGroupId, job: str, err: Exception):
        return self.services[wg].unbind.remote(job, err)

    async def shutdown(self) -> None:
        await asyncio.gather(*(s.close.remote() for s in self.services.values()),
                             return_exceptions=True)
        for service in self.services.values():
            ray.kill(service)
        remove_placement_group(self._reservation)
        shutil.rmtree(self._host_root, ignore_errors=True)
        shutil.rmtree(self._spill_root, ignore_errors=True)

