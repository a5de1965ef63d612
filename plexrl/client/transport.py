"""How a client finds a runtime: the ``Transport`` protocol and a registry of them by scheme.

Owns: ``Transport`` (register, submit, end, inspect, close; each returns a
``concurrent.futures.Future``), the registry that maps an address to a transport factory by
scheme, and ``open_transport``. Factories are named by dotted path and imported only when
asked for, so the client never imports a runtime: ``ray`` (the embedded local default and
cluster addresses) and ``mock`` ship here; a package adds its own through the
``plexrl.transports`` entry-point group or ``register_transport``.
Must not know: Ray, torch, or how any runtime carries out a call.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from concurrent.futures import Future
from typing import Callable, Protocol

from plexrl.errors import ConfigError
from plexrl.protocol import CallRequest, JobRequest, Ticket


class Transport(Protocol):
    """Carries a job's requests to a runtime; every method answers with a future. A
    transport that can take over a job registered elsewhere also has ``attach(ticket) ->
    Future[JobRequest]`` (``Runtime.attach_job`` uses it when present)."""

    def register(self, request: JobRequest) -> "Future[Ticket]": ...

    def submit(self, request: CallRequest) -> Future: ...

    def end(self, ticket: Ticket) -> "Future[None]": ...

    def inspect(self, what: str) -> Future: ...

    def close(self) -> None: ...


#: scheme -> "module:attribute" of a factory ``f(address, **options) -> Transport``
_FACTORIES: dict[str, str | Callable[..., Transport]] = {
    "ray": "plexrl.runtime.transport:RayTransport",
    "mock": "plexrl.client.mock:MockTransport",
}


def register_transport(scheme: str, factory: str | Callable[..., Transport]) -> None:
    """Make ``scheme://...`` addresses open with ``factory`` (a callable or a dotted path)."""
    _FACTORIES[scheme] = factory


def open_transport(address: str | None = None, **options) -> Transport:
    """The transport for ``address``: None or "local" starts the embedded local runtime;
    "ray://host:port" or "host:port" joins a Ray cluster; "mock" is for tests."""
    scheme, _, rest = (address or "local").partition("://")
    if not rest:
        scheme, rest = ("ray", scheme) if scheme not in _FACTORIES else (scheme, "")
    factory = _FACTORIES.get(scheme) or _entry_point(scheme)
    if factory is None:
        raise ConfigError("no transport for this address", field="address", value=address,
                          fix=f"use one of {sorted(_FACTORIES)} (scheme://...) or 'local'")
    if isinstance(factory, str):
        module, _, attr = factory.partition(":")
        factory = getattr(importlib.import_module(module), attr)
    return factory(rest or "local", **options)


def _entry_point(scheme: str):
    for point in importlib.metadata.entry_points(group="plexrl.transports"):
        if point.name == scheme:
            return point.load()
    return None
