"""The one executor of the runtime: worker groups reserved on Ray, and decisions as actor calls.

Owns: reserving each worker group with a Ray placement group (one bundle of its devices:
GPUs where the cluster has them, else the ``plexrl_device`` resource that stands for an
emulated device), starting one service actor per group inside its reservation, and turning
``Dispatch`` / ``Move`` / binding into calls on that actor, each answered by an object
reference. Must not know: why a decision was made, or what a call computes.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from plexrl.core.decisions import Move
from plexrl.errors import ConfigError
from plexrl.protocol import WorkerGroupId
from plexrl.runtime.config import NODE, RuntimeConfig
from plexrl.runtime.jobs import CallOrder
from plexrl.runtime.service_actor import ServiceActor

DEVICE_RESOURCE = "plexrl_device"   #: the Ray resource of one emulated device
READY_TIMEOUT_S = 60.0


class Executor:
    def __init__(self, services: dict[WorkerGroupId, object], groups: list, host_root: Path,
                 spill_root: Path | None = None):
        self.services = services
        self._groups = groups
        self._host_root, self._spill_root = host_root, spill_root

    @classmethod
    async def start(cls, config: RuntimeConfig, session: str) -> "Executor":
        """Reserve every worker group and start its service actor; wait until all answer."""
        resource = "GPU" if ray.cluster_resources().get("GPU") else DEVICE_RESOURCE
        actor = ray.remote(ServiceActor)
        services, groups = {}, []
        spill = Path(config.spill_root) / f"plexrl-{session}"   # per session, per group below
        for group in config.worker_groups:
            bundle = {resource: group.num_devices}
            pg = placement_group([bundle], strategy="STRICT_PACK", name=f"{session}-{group.name}")
            groups.append(pg)
            try:
                await asyncio.wait_for(pg.ready(), READY_TIMEOUT_S)
            except asyncio.TimeoutError:
                have = ray.cluster_resources().get(resource, 0)
                raise ConfigError(
                    f"worker group {group.name} could not reserve {group.num_devices} "
                    f"{resource} within {READY_TIMEOUT_S:.0f} s (the cluster has {have:g})",
                    field="worker_groups", value=group.name,
                    fix=f"start Ray with resources={{'{resource}': N}} or ask for fewer devices"
                ) from None
            options = {resource: group.num_devices} if resource != "GPU" else {}
            services[WorkerGroupId(group.name)] = actor.options(
                name=f"{session}-service-{group.name}", num_cpus=0,
                num_gpus=group.num_devices if resource == "GPU" else 0,
                resources=options, max_concurrency=1000,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0),
                runtime_env={"env_vars": {"OMP_NUM_THREADS": str(config.threads)}},
            ).remote(group.name, config.device_bytes * group.num_devices,
                     str(Path(config.host_root) / f"plexrl-{session}" / NODE / group.name),
                     config.threads, config.skip_onload, str(spill / NODE / group.name))
        await asyncio.gather(*(s.ready.remote() for s in services.values()))
        return cls(services, groups, Path(config.host_root) / f"plexrl-{session}", spill)

    def bind(self, wg: WorkerGroupId, *args):
        return self.services[wg].bind.remote(*args)

    def dispatch(self, wg: WorkerGroupId, order: CallOrder):
        """Tell the service to run a call its job has sent it; answers a small record once
        the call ran (the job gets the result from the service itself)."""
        return self.services[wg].go.remote(order)

    def refuse(self, wg: WorkerGroupId, job: str, seq: int, err: Exception):
        return self.services[wg].fail.remote(job, seq, err)

    def move(self, move: Move):
        return self.services[move.wg].move.remote(move.key, move.src, move.dst, move.reason)

    def unbind(self, wg: WorkerGroupId, job: str, err: Exception):
        return self.services[wg].unbind.remote(job, err)

    async def shutdown(self) -> None:
        await asyncio.gather(*(s.close.remote() for s in self.services.values()),
                             return_exceptions=True)
        for service in self.services.values():
            ray.kill(service)
        for pg in self._groups:
            remove_placement_group(pg)
        shutil.rmtree(self._host_root, ignore_errors=True)
        if self._spill_root is not None:
            shutil.rmtree(self._spill_root, ignore_errors=True)

