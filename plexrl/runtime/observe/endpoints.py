"""The controller's HTTP endpoints: Prometheus metrics and the live dashboard.

Owns: a small HTTP/1.1 server (GET only, one request per connection) on the controller's
own asyncio loop, so every read of the controller's records happens on the thread that
writes them; its routes (``/metrics``, ``/`` the dashboard, ``/api/state`` its JSON); and
fetching the services' new transitions before a scrape. Binds loopback unless told
otherwise, on the port asked for (0: one the OS picks).
Must not know: scheduling, what the metrics mean (``metrics.py``, ``measures.py``).
"""

from __future__ import annotations

import asyncio
import json
import time

from plexrl.runtime.observe import measures
from plexrl.runtime.observe.dashboard import dashboard_state, render_page
from plexrl.runtime.observe.metrics import CONTENT_TYPE, RuntimeMetrics

MAX_REQUEST_BYTES = 16 << 10
READ_TIMEOUT_S = 10.0


class Endpoints:
    """Serves one controller (anything with ``call_log``, ``snap`` and ``executor``)."""

    def __init__(self, controller, started_s: float, window_s: float = 60.0):
        self.controller = controller
        self.started_s = started_s                 #: the controller's start, monotonic s
        self.window_s = window_s
        self.metrics = RuntimeMetrics(window_s)
        self.tally = measures.Tally()
        self._server: asyncio.AbstractServer | None = None
        self.host, self.port = "", 0

    @classmethod
    async def start(cls, controller, host: str = "127.0.0.1", port: int = 0) -> "Endpoints":
        out = cls(controller, time.monotonic())
        out._server = await asyncio.start_server(out._serve, host, port)
        out.host, out.port = out._server.sockets[0].getsockname()[:2]
        return out

    def urls(self) -> dict:
        base = f"http://{self.host}:{self.port}"
        return {"metrics": f"{base}/metrics", "dashboard": f"{base}/",
                "state": f"{base}/api/state"}

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    # -- what the routes answer ---------------------------------------------------------------
    async def scrape(self) -> bytes:
        """The metrics text, after counting the services' transitions not yet counted."""
        services = self.controller.executor.services
        names = list(services)
        logs = await asyncio.gather(*(services[wg].transitions.remote(
            False, self.metrics.num_moves.get(wg, 0)) for wg in names))
        self.metrics.update(self.controller.call_log, self.controller.snap,
                            dict(zip(names, logs)), self.readings(time.monotonic()))
        return self.metrics.render()

    def readings(self, now: float) -> dict:
        return measures.readings(self.tally, self.controller.call_log, self.controller.snap, now,
                                self.started_s, self.window_s)

    def state(self) -> dict:
        now = time.monotonic()
        return dashboard_state(self.controller.call_log, self.controller.snap, now,
                               self.started_s, self.readings(now), self.window_s)

    async def _answer(self, path: str) -> tuple[int, str, bytes]:
        route = path.split("?", 1)[0]
        if route == "/metrics":
            return 200, CONTENT_TYPE, await self.scrape()
        if route == "/api/state":
            return 200, "application/json", json.dumps(self.state()).encode()
        if route in ("/", "/index.html"):
            return 200, "text/html; charset=utf-8", render_page(self.state()).encode()
        return 404, "text/plain; charset=utf-8", b"not found: try /, /metrics or /api/state\n"

    # -- HTTP ---------------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), READ_TIMEOUT_S)
            if len(head) > MAX_REQUEST_BYTES:
                raise ValueError("request too large")
            method, path, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            if method not in ("GET", "HEAD"):
                status, kind, body = 405, "text/plain; charset=utf-8", b"GET only\n"
            else:
                try:
                    status, kind, body = await self._answer(path)
                except Exception as err:   # a bug here must not take the controller down
                    status, kind = 500, "text/plain; charset=utf-8"
                    body = f"{type(err).__name__}: {err}\n".encode()
            reason = {200: "OK", 404: "Not Found", 405: "Method Not Allowed",
                      500: "Internal Server Error"}[status]
            writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: {kind}\r\n"
                         f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\n"
                         "Connection: close\r\n\r\n".encode("latin-1"))
            if method != "HEAD":
                writer.write(body)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError,
                ConnectionError, ValueError):
            pass   # a client that went away or sent garbage gets nothing
        finally:
            writer.close()
