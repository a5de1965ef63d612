"""A transport built from a plain function, for unit tests of code written on the client.

Owns: ``MockTransport``: registration hands out tickets, every call goes to ``handler(request)``
at once, on the caller's thread, and its return value (or exception) completes the future.
Must not know: any runtime.
"""

from __future__ import annotations

import secrets
from concurrent.futures import Future
from typing import Callable

from plexrl.errors import AuthError
from plexrl.protocol import CallRequest, JobRequest, Ticket


class MockTransport:
    """``handler(request) -> result``; records every request in ``requests``."""

    def __init__(self, address: str = "", handler: Callable[[CallRequest], object] | None = None):
        self.handler = handler or (lambda request: None)
        self.requests: list[CallRequest] = []
        self.tokens: dict[str, str] = {}

    def register(self, request: JobRequest) -> "Future[Ticket]":
        self.tokens[request.job] = secrets.token_hex(16)
        return _done(lambda: Ticket(request.job, self.tokens[request.job]))

    def submit(self, request: CallRequest) -> Future:
        self.requests.append(request)

        def run():
            if self.tokens.get(request.job) != request.token:
                raise AuthError(f"job {request.job}: unknown job or wrong token", job=request.job)
            return self.handler(request)
        return _done(run)

    def end(self, ticket: Ticket) -> "Future[None]":
        return _done(lambda: self.tokens.pop(ticket.job, None) and None)

    def inspect(self, what: str) -> Future:
        return _done(lambda: {"requests": list(self.requests)})

    def close(self) -> None:
        pass


def _done(fn) -> Future:
    future: Future = Future()
    try:
        future.set_result(fn())
    except Exception as err:   # the future carries it to the caller
        future.set_exception(err)
    return future
