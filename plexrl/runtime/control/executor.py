"""The one executor of the runtime: worker groups reserved on Ray, and decisions as actor calls.

Owns: reserving the worker groups with one Ray placement group (a bundle of each group's
devices, so a group sits on one node: GPUs where the cluster has them, else the
``plexrl_device`` resource that stands for an emulated device), spread over the nodes,
starting the service actors of each group inside its bundle, on that node -- one per device
for the torch engine (the group's ranks, joined in one process group; rank 0 leads and is
the group's service), one for the simulated engine -- and turning ``Dispatch`` / ``Move`` /
binding into calls on the group's service, each answered by an object reference. The reservation and the service actors are detached and named by session, so they
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
                 reservation, host_root: Path, spill_root: Path,
                 ranks: dict[WorkerGroupId, list] | None = None):
        self.services = services     #: each live group's service (its lead rank)
        self.nodes = nodes           #: the Ray node each worker group sits on
        #: every rank's actor of each group started, lead first (a lost group's too)
        self.ranks = ranks if ranks is not None else {wg: [s] for wg, s in services.items()}
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
        ranks, nodes = {}, {}
        host_root = Path(config.host_root) / f"plexrl-{session}"
        spill_root = Path(config.spill_root) / f"plexrl-{session}"
        for index, group in enumerate(config.worker_groups):
            wg = WorkerGroupId(group.name)
            nodes[wg] = placed[index]
            world = group.num_devices if config.engine == "torch" else 1
            each = group.num_devices // world   # devices per rank
            ranks[wg] = []
            for rank in range(world):
                where = group.name if world == 1 else f"{group.name}/rank{rank}"
                ranks[wg].append(actor.options(
                    name=_name(session, group.name, rank), num_cpus=0, lifetime="detached",
                    num_gpus=each if resource == "GPU" else 0,
                    resources={resource: each} if resource != "GPU" else {},
                    max_concurrency=1000,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, index),
                    runtime_env={"env_vars": {"OMP_NUM_THREADS": str(config.threads)}},
                ).remote(group.name, config.device_bytes * each,
                         str(host_root / nodes[wg] / where), config.threads, config.skip_onload,
                         str(spill_root / nodes[wg] / where), config.fail_at,
                         engine=config.engine, recent_calls=config.recent_calls,
                         call_s=config.sim_call_s, cores=config.cores_of(index), rank=rank,
                         world=world))
        await asyncio.gather(*(_join(group) for group in ranks.values() if len(group) > 1))
        services = {wg: group[0] for wg, group in ranks.items()}
        await asyncio.gather(*(s.ready.remote() for s in services.values()))
        return cls(services, nodes, pg, host_root, spill_root, ranks)

    @classmethod
    async def attach(cls, config: RuntimeConfig, session: str) -> "Executor":
        """The worker groups a previous controller of ``session`` started, found by name
        (a restarted controller); a group whose service is gone is left out."""
        pg = ray.util.get_placement_group(f"plexrl-{session}-groups")
        placed = placement_group_table(pg)["bundles_to_node_id"]
        services, nodes, ranks = {}, {}, {}
        for index, group in enumerate(config.worker_groups):
            wg = WorkerGroupId(group.name)
            world = group.num_devices if config.engine == "torch" else 1
            found = []
            for rank in range(world):
                try:
                    found.append(ray.get_actor(_name(session, group.name, rank)))
                except ValueError:
                    continue
            ranks[wg] = found
            try:
                if len(found) < world:
                    continue
                await asyncio.gather(*(r.ping.remote() for r in found))
            except ray.exceptions.RayActorError:
                continue
            services[wg], nodes[wg] = found[0], placed[index]
        return cls(services, nodes, pg, Path(config.host_root) / f"plexrl-{session}",
                   Path(config.spill_root) / f"plexrl-{session}", ranks)

    async def dead_rank(self, wg: WorkerGroupId) -> int | None:
        """The first rank of ``wg`` that does not answer (0: its lead), or None."""
        for rank, actor in enumerate(self.ranks.get(wg, [])):
            try:
                await actor.ping.remote()
            except ray.exceptions.RayActorError:
                return rank
        service = self.services.get(wg)
        return await service.lost_rank.remote() if service is not None else None

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
        """Forget ``job`` on ``wg`` (on a lost group too, whose lead may still hold its calls)."""
        return (self.services.get(wg) or self.ranks[wg][0]).unbind.remote(job, err)

    async def shutdown(self) -> None:
        await asyncio.gather(*(s.close.remote() for s in self.services.values()),
                             return_exceptions=True)
        for actor in (a for group in self.ranks.values() for a in group):
            ray.kill(actor)
        remove_placement_group(self._reservation)
        shutil.rmtree(self._host_root, ignore_errors=True)
        shutil.rmtree(self._spill_root, ignore_errors=True)


def _name(session: str, group: str, rank: int) -> str:
    """A rank's actor name; the lead's is the group's service name."""
    return f"plexrl-{session}-service-{group}" + (f"-rank{rank}" if rank else "")


async def _join(group: list) -> None:
    """Join a group's ranks in one process group at the lead's endpoint; the lead learns
    the others."""
    address = await group[0].endpoint.remote()
    await asyncio.gather(*(rank.join.remote(address) for rank in group))
    await group[0].set_peers.remote(group[1:])
