"""``RayTransport``: how a client reaches the runtime on Ray (scheme ``ray``, and the default).

Owns: joining a Ray cluster, or starting the embedded local one on loopback
(``ray.init(address="local")``) with one ``plexrl_device`` resource per emulated device;
starting this connection's controller; and turning each request into controller calls whose
answers complete ``concurrent.futures.Future``s. A call's payload is put in the object store
here and reaches the service by reference; its result comes back from the service directly.
Errors arrive as the ``PlexError`` the runtime raised, not wrapped.
Must not know: scheduling, or what a call computes.
"""

from __future__ import annotations

import os
import secrets
from concurrent.futures import Future
from dataclasses import replace

import ray

from plexrl.errors import ServiceLost
from plexrl.protocol import CallRequest, JobRequest, Ticket
from plexrl.runtime.config import RuntimeConfig
from plexrl.runtime.controller import Controller
from plexrl.runtime.executor import DEVICE_RESOURCE

NAMESPACE = "plexrl"


def init_local(num_devices: int, **kwargs) -> None:
    """Start the embedded single-machine Ray cluster on loopback, without usage stats."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(address="local", namespace=NAMESPACE, include_dashboard=False,
             resources={DEVICE_RESOURCE: num_devices}, logging_level="WARNING", **kwargs)


class RayTransport:
    """One controller (and its services) per connection; closed with ``close``."""

    def __init__(self, address: str = "local", *, config: RuntimeConfig | None = None):
        self.config = config or RuntimeConfig()
        self._owns_ray = not ray.is_initialized()
        if self._owns_ray:
            if address == "local":
                init_local(max(self.config.num_devices, 1))
            else:
                ray.init(address=address, namespace=NAMESPACE, logging_level="WARNING")
        self.session = secrets.token_hex(4)
        self.controller = ray.remote(Controller).options(
            name=f"plexrl-controller-{self.session}", num_cpus=0, max_concurrency=1000,
        ).remote(self.config, self.session)
        self.info = ray.get(self.controller.start.remote())

    def register(self, request: JobRequest) -> "Future[Ticket]":
        return _future(self.controller.register.remote(request))

    def submit(self, request: CallRequest) -> Future:
        payload = ray.put(request.payload)
        head = self.controller.submit.remote(replace(request, payload=None), [payload])
        out: Future = Future()

        def dispatched(answer: Future) -> None:
            try:
                [result] = answer.result()
            except Exception as err:
                out.set_exception(_unwrap(err))
                return
            result.future().add_done_callback(lambda done: _settle(out, done))
        head.future().add_done_callback(dispatched)
        return out

    def end(self, ticket: Ticket) -> "Future[None]":
        return _future(self.controller.end.remote(ticket))

    def inspect(self, what: str) -> Future:
        return _future(self.controller.inspect.remote(what))

    def service(self, wg: str):
        """The actor handle of a worker group's service (tests and tools)."""
        return ray.get(self.controller.service.remote(wg))[0]

    def close(self) -> None:
        try:
            ray.get(self.controller.shutdown.remote())
        finally:
            ray.kill(self.controller)
            if self._owns_ray:
                ray.shutdown()


def _future(ref) -> Future:
    out: Future = Future()
    ref.future().add_done_callback(lambda done: _settle(out, done))
    return out


def _settle(out: Future, done: Future) -> None:
    try:
        out.set_result(done.result())
    except Exception as err:
        out.set_exception(_unwrap(err))


def _unwrap(err: Exception) -> Exception:
    """The runtime's own error inside Ray's wrapper; a dead actor as ``ServiceLost``."""
    if isinstance(err, ray.exceptions.RayTaskError) and err.cause is not None:
        return err.cause
    if isinstance(err, ray.exceptions.RayActorError):
        return ServiceLost(f"a runtime actor died: {err}")
    return err
