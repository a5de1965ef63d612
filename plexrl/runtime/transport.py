"""``RayTransport``: how a client reaches the runtime on Ray (scheme ``ray``, and the default).

Owns: joining a Ray cluster, or starting the embedded local one on loopback
(``ray.init(address="local")``) with one ``plexrl_device`` resource per emulated device;
starting this connection's controller; and turning each request into controller calls whose
answers complete ``concurrent.futures.Future``s. A call goes to two places at once: with its
payload, straight to the service of its worker group, which holds it until the controller
says go; and, described without its payload, to the controller. Its result comes back from
the service directly.
Errors arrive as the ``PlexError`` the runtime raised, not wrapped.

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
import threading
from concurrent.futures import Future, InvalidStateError
from dataclasses import replace
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from plexrl.errors import CallError, ServiceLost
from plexrl.protocol import CallRequest, JobRequest, Ticket
from plexrl.runtime.config import RuntimeConfig, WorkerGroupConfig
from plexrl.runtime.control.controller import Controller
from plexrl.runtime.control.executor import DEVICE_RESOURCE

NAMESPACE = "plexrl"


def init_local(num_devices: int, **kwargs) -> None:
    """Start the embedded single-machine Ray cluster on loopback, without usage stats."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    ray.init(address="local", namespace=NAMESPACE, include_dashboard=False,
             resources={DEVICE_RESOURCE: num_devices}, logging_level="WARNING", **kwargs)


class RayTransport:
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
        self._routes: dict[str, dict] = {}
        self._tickets: dict[str, Ticket] = {}
        self._closed = threading.Event()
        threading.Thread(target=self._renew, name="plexrl-lease", daemon=True).start()

    def _renew(self) -> None:
        while not self._closed.wait(self.info["lease_s"] / 3):
            if self._tickets:
                self.controller.renew.remote(list(self._tickets.values()))

    def register(self, request: JobRequest) -> "Future[Ticket]":
        """Register; the ticket comes once the job's routes (its services) are known here."""
        out: Future = Future()

        def placed(done: Future) -> None:
            try:
                ticket = done.result()
            except Exception as err:
                _set(out, error=_unwrap(err))
                return
            routes = self.controller.routes.remote(ticket)
            routes.future().add_done_callback(lambda got: self._routed(out, ticket, got))
        self.controller.register.remote(request).future().add_done_callback(placed)
        return out

    def _routed(self, out: Future, ticket: Ticket, got: Future) -> None:
        try:
            self._routes[ticket.job] = dict(got.result())   # copy_id -> service
            self._tickets[ticket.job] = ticket
            self.controller.renew.remote([ticket])
        except Exception as err:
            _set(out, error=_unwrap(err))
            return
        _set(out, value=ticket)

    def attach(self, ticket: Ticket) -> "Future[JobRequest]":
        """Take over a job registered elsewhere (a submitted job's program holds its ticket):
        its registration, once the job is placed and its routes are known here."""
        out: Future = Future()

        def attached(done: Future) -> None:
            try:
                request = done.result()
            except Exception as err:
                _set(out, error=_unwrap(err))
                return
            routed: Future = Future()
            routed.add_done_callback(lambda r: _set(out, value=request) if r.exception() is None
                                     else _set(out, error=r.exception()))
            routes = self.controller.routes.remote(ticket)
            routes.future().add_done_callback(lambda got: self._routed(routed, ticket, got))
        self.controller.attach.remote(ticket).future().add_done_callback(attached)
        return out

    def submit(self, request: CallRequest) -> Future:
        """Send the call with its payload to its service, and its description to the
        controller; the result comes from the service, a refusal from either."""
        out: Future = Future()
        bare = replace(request, payload=None)
        service = self._routes.get(request.job, {}).get(request.copy_id)
        head = self.controller.submit.remote(bare)    # first: the go starts from there
        head.future().add_done_callback(lambda done: _refused(out, done, service is None))
        if service is not None:
            result = service.run.remote(bare, request.payload)
            result.future().add_done_callback(lambda done: self._ran(out, done, request))
        return out

    def _ran(self, out: Future, done: Future, request: CallRequest) -> None:
        """The service's answer; if the service (or a rank of its group) died, the
        controller's ``ServiceLost`` for the job (with its last checkpoint) instead."""
        try:
            _set(out, value=done.result())
            return
        except ray.exceptions.RayActorError as err:
            died = err
        except Exception as err:
            if not isinstance(_unwrap(err), ServiceLost):
                _set(out, error=_unwrap(err))
                return
            died = err   # a rank of the group died: the controller's error names the checkpoint
        ticket = Ticket(request.job, request.token)

        def named(answer: Future) -> None:
            try:
                lost = answer.result()
            except Exception:
                lost = None
            _set(out, error=lost or _unwrap(died))
        self.controller.lost.remote(ticket).future().add_done_callback(named)

    def end(self, ticket: Ticket) -> "Future[None]":
        self._tickets.pop(ticket.job, None)
        return _future(self.controller.end.remote(ticket))

    def inspect(self, what: str) -> Future:
        return _future(self.controller.inspect.remote(what))

    def service(self, wg: str):
        """The actor handle of a worker group's service (tests and tools)."""
        return ray.get(self.controller.service.remote(wg))[0]

    def host_dir(self, wg: str) -> Path:
        """Where a worker group's HOST copies live (they outlive its service actor)."""
        return Path(self.config.host_root) / f"plexrl-{self.session}" / self.info["nodes"][wg] / wg

    def close(self) -> None:
        """Stop renewing; shut the controller and its services down if this connection
        started them."""
        self._closed.set()
        if not self._owns_controller:
            return
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
        _set(out, value=done.result())
    except Exception as err:
        _set(out, error=_unwrap(err))


def _refused(out: Future, done: Future, unrouted: bool) -> None:
    """The controller's answer settles the call only when it refuses it (or, for a call no
    service can take, always)."""
    try:
        done.result()
    except Exception as err:
        _set(out, error=_unwrap(err))
        return
    if unrouted:
        _set(out, error=CallError("the call has no service to run on (its job has no such "
                                  "model copy)"))


def _set(out: Future, *, value=None, error: Exception | None = None) -> None:
    """Complete ``out`` once: the first of the service and the controller to answer wins."""
    try:
        out.set_exception(error) if error is not None else out.set_result(value)
    except InvalidStateError:
        pass


def _unwrap(err: Exception) -> Exception:
    """The runtime's own error inside Ray's wrapper; a dead actor as ``ServiceLost``."""
    if isinstance(err, ray.exceptions.RayTaskError) and err.cause is not None:
        return err.cause
    if isinstance(err, ray.exceptions.RayActorError):
        return ServiceLost(f"a runtime actor died: {err}")
    return err
