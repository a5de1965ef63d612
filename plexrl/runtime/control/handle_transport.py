"""``HandleTransport``: the ``Transport`` over a controller's Ray actor handle.

Owns: turning each request into controller calls whose answers complete
``concurrent.futures.Future``s. A call goes to two places at once: with its payload, straight
to the service of its worker group, which holds it until the controller says go; and,
described without its payload, to the controller. Its result comes back from the service
directly. Errors arrive as the ``PlexError`` the runtime raised, not wrapped; a call whose
service died is settled with the controller's ``ServiceLost`` for the job, which names its
last checkpoint. While it is open, a thread renews the lease of every job registered through
it. ``runtime/transport.py``'s ``RayTransport`` is this over the controller it starts or
joins; a client inside the controller's own process (the Tinker API) uses it over the
controller's own handle.
Must not know: scheduling, or what a call computes.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future, InvalidStateError
from dataclasses import replace

import ray

from plexrl.errors import CallError, ServiceLost
from plexrl.protocol import CallRequest, JobRequest, Ticket


class HandleTransport:
    """Requests to the controller behind ``controller`` (an actor handle), renewing leases
    every ``lease_s / 3``."""

    def __init__(self, controller, lease_s: float):
        self.controller, self.lease_s = controller, lease_s
        self._routes: dict[str, dict] = {}
        self._tickets: dict[str, Ticket] = {}
        self._closed = threading.Event()
        threading.Thread(target=self._renew, name="plexrl-lease", daemon=True).start()

    def _renew(self) -> None:
        while not self._closed.wait(self.lease_s / 3):
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

    def close(self) -> None:
        """Stop renewing."""
        self._closed.set()


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
