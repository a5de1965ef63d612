"""``RayTransport``: how a client reaches the runtime on Ray (scheme ``ray``, and the default).

Owns: joining a Ray cluster, or starting the embedded local one on loopback
(``ray.init(address="local")``) with one ``plexrl_device`` resource per emulated device;
starting this connection's controller. Requests travel as ``HandleTransport`` sends them
(``control/handle_transport.py``: payloads straight to the services, descriptions to the
controller).

The controller it starts is restartable (``max_restarts=-1``) and every call on it is retried
by Ray until the restarted controller answers it (``max_task_retries=-1``): a submit the dead
controller never acknowledged is resent with the same sequence number (the controller answers a
repeat from its journal; the service, from its record). A call whose service died is settled
with the controller's ``ServiceLost`` for the job, which names its last checkpoint.
Must not know: scheduling, or what a call computes.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import replace
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from plexrl.runtime.config import RuntimeConfig, WorkerGroupConfig
from plexrl.runtime.control.controller import Controller
from plexrl.runtime.control.executor import DEVICE_RESOURCE
from plexrl.runtime.control.handle_transport import HandleTransport

NAMESPACE = "plexrl"


def init_local(num_devices: int, **kwargs) -> None:
    """Start the embedded single-machine Ray cluster on loopback, without usage stats."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(address="local", namespace=NAMESPACE, include_dashboard=False,
             resources={DEVICE_RESOURCE: num_devices}, logging_level="WARNING", **kwargs)


class RayTransport(HandleTransport):
    """One controller (and its services) per connection, closed with ``close``; or, with
    ``controller=NAME``, a connection to a controller another driver started (it stays up).
    ``devices=N`` makes the config's first worker group one of N devices, the only one.

    While the connection is open, a thread renews the lease of every job registered through
    it; a driver that dies stops renewing, and its jobs end after ``lease_s``."""

    def __init__(self, address: str = "local", *, config: RuntimeConfig | None = None,
                 controller: str | None = None, devices: int | None = None):
        self.config = config or RuntimeConfig()
        if devices is not None:   # one worker group of that many devices (a rank each)
            self.config = replace(self.config, worker_groups=(
                WorkerGroupConfig(self.config.worker_groups[0].name, devices),))
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            if address == "local":
                init_local(max(self.config.num_devices, 1))
            else:
                ray.init(address=address, namespace=NAMESPACE, logging_level="WARNING")
        self._owns_controller = controller is None
        if controller is None:
            self.session = secrets.token_hex(4)
            controller = f"plexrl-controller-{self.session}"
            self.controller = ray.remote(Controller).options(   # on this driver's node
                name=controller, num_cpus=0, max_concurrency=1000, max_restarts=-1,
                max_task_retries=-1,
                scheduling_strategy=NodeAffinitySchedulingStrategy(
                    ray.get_runtime_context().get_node_id(), soft=False),
            ).remote(self.config, self.session)
            self.info = ray.get(self.controller.start.remote())
        else:
            self.controller = ray.get_actor(controller, namespace=NAMESPACE)
            self.info = ray.get(self.controller.info.remote())
            self.session = self.info["session"]
        self.controller_name = controller
        super().__init__(self.controller, self.info["lease_s"])

    def service(self, wg: str):
        """The actor handle of a worker group's service (tests and tools)."""
        return ray.get(self.controller.service.remote(wg))[0]

    def host_dir(self, wg: str) -> Path:
        """Where a worker group's HOST copies live (they outlive its service actor)."""
        return Path(self.config.host_root) / f"plexrl-{self.session}" / self.info["nodes"][wg] / wg

    def close(self) -> None:
        """Stop renewing; shut the controller and its services down if this connection
        started them."""
        super().close()
        if not self._owns_controller:
            return
        try:
            ray.get(self.controller.shutdown.remote())
        finally:
            ray.kill(self.controller)
            if self._owns_ray:
                ray.shutdown()
