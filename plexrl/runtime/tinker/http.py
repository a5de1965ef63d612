"""A small HTTP/1.1 server for JSON APIs, on the caller's asyncio loop.

Owns: parsing requests with ``h11`` (keep-alive, bodies of any method, ``Content-Length``),
calling one async handler per request, and writing its ``Reply`` (status, JSON or raw bytes,
headers). A handler's exception is a 500 with a JSON body naming it; a request larger than
``max_body_bytes`` is a 413. Must not know: which API it serves.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Awaitable, Callable

import h11

READ_BYTES = 64 << 10


@dataclass(frozen=True)
class Request:
    method: str
    path: str                    #: without the query string
    headers: dict[str, str]      #: names lower-cased
    body: bytes
    oversize: bool = False       #: the body was over the server's limit (dropped)

    def json(self):
        return json.loads(self.body or b"{}")


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: object = None          #: JSON-able, or ``bytes`` sent as ``content_type``
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = field(default=())

    def payload(self) -> bytes:
        if isinstance(self.body, bytes):
            return self.body
        return json.dumps({} if self.body is None else self.body).encode()


Handler = Callable[[Request], Awaitable[Reply]]


class HttpServer:
    """``await HttpServer.start(handler, host, port)``; ``url``; ``await stop()``."""

    def __init__(self, handler: Handler, max_body_bytes: int):
        self.handler, self.max_body_bytes = handler, max_body_bytes
        self._server: asyncio.AbstractServer | None = None
        self._open: set[asyncio.Task] = set()   #: the connections being served
        self.host, self.port = "", 0

    @classmethod
    async def start(cls, handler: Handler, host: str = "127.0.0.1", port: int = 0,
                    max_body_bytes: int = 256 << 20) -> "HttpServer":
        out = cls(handler, max_body_bytes)
        out._server = await asyncio.start_server(out._serve, host, port)
        out.host, out.port = out._server.sockets[0].getsockname()[:2]
        return out

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def stop(self) -> None:
        """Stop listening and close every open connection (kept-alive ones wait on a read)."""
        if self._server is not None:
            self._server.close()
            for task in list(self._open):
                task.cancel()
            await asyncio.gather(*self._open, return_exceptions=True)
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h11.Connection(h11.SERVER, max_incomplete_event_size=READ_BYTES)
        task = asyncio.current_task()
        self._open.add(task)
        try:
            while True:
                request = await self._read(conn, reader)
                if request is None:
                    return
                reply = await self._answer(request)
                writer.write(self._write(conn, reply))
                await writer.drain()
                if conn.our_state is h11.MUST_CLOSE or conn.their_state is h11.MUST_CLOSE:
                    return
                conn.start_next_cycle()
        except (ConnectionError, h11.RemoteProtocolError, asyncio.IncompleteReadError,
                asyncio.CancelledError):
            return
        finally:
            self._open.discard(task)
            writer.close()

    async def _read(self, conn: h11.Connection, reader) -> Request | None:
        head, body, oversize = None, bytearray(), False
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(READ_BYTES)
                conn.receive_data(data)
                if not data and head is None:
                    return None
                continue
            if isinstance(event, h11.ConnectionClosed):
                return None
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                oversize = oversize or len(body) + len(event.data) > self.max_body_bytes
                if not oversize:
                    body += event.data
            elif isinstance(event, h11.EndOfMessage):
                headers = {k.decode().lower(): v.decode() for k, v in head.headers}
                path = head.target.decode().split("?", 1)[0]
                return Request(head.method.decode(), path, headers,
                               b"" if oversize else bytes(body), oversize)

    async def _answer(self, request: Request) -> Reply:
        if request.oversize:
            return Reply(413, {"detail": f"request body over {self.max_body_bytes} bytes"})
        try:
            return await self.handler(request)
        except Exception as err:   # the client reads it; the server goes on
            return Reply(500, {"detail": f"{type(err).__name__}: {err}"})

    @staticmethod
    def _write(conn: h11.Connection, reply: Reply) -> bytes:
        payload = reply.payload()
        headers = [("content-type", reply.content_type), ("content-length", str(len(payload))),
                   *reply.headers]
        return conn.send(h11.Response(status_code=reply.status, headers=headers)) + \
            conn.send(h11.Data(data=payload)) + conn.send(h11.EndOfMessage())
