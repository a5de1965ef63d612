"""The Tinker server: what the official ``tinker`` SDK (0.38.0) asks a server, answered.

Owns: its thread and loop (``start_thread``; decoding bodies never holds up the
controller's), the dispatch of a request to its route once its key is a tenant's
(``tenants.py``), a session's life (client config, dynamic config, create session,
heartbeat, finish: the session's models end, telemetry), the health check, the capabilities
(the built-in model configs and the checkpoint directories the config names), and the
futures (retrieve, cancel). The routes on models are ``model_routes.py``, on sampling
``sampling_routes.py``.
Errors are JSON bodies with the status the SDK maps to its own exception (400
``BadRequestError``, 401 ``AuthenticationError``, 404 ``NotFoundError``), or, for a call
that fails once running, ``{"error", "category"}`` (``RequestFailedError``); each says
what was wrong and how to fix it.
Must not know: scheduling, Ray, torch (model configs are read when capabilities are asked).
"""

from __future__ import annotations

import asyncio
import re
import secrets
import threading
import time
from pathlib import Path

from plexrl.errors import PlexError
from plexrl.runtime.tinker import wire
from plexrl.runtime.tinker.futures import UserError
from plexrl.runtime.tinker.http import HttpServer, Reply, Request
from plexrl.runtime.tinker.model_routes import ModelRoutes
from plexrl.runtime.tinker.sampling_routes import SamplingRoutes
from plexrl.runtime.tinker.tenants import (KEY_PREFIX, NotFound, Session, Tenants, body_of,
                                           error)
from plexrl.runtime.tinker.training import TinkerModel

API = "/api/v1"
SDK_VERSION = "0.38.0"           #: the SDK whose wire protocol this serves


class TinkerServer:
    """``TinkerServer.start_thread(runtime, root, host, port, keys, sources)``; ``url``;
    ``stop_thread()``. ``runtime`` is a ``plexrl.client.Runtime`` whose jobs the models
    become; ``root`` holds the checkpoints."""

    def __init__(self, runtime=None, root: str | Path = "", keys: tuple[str, ...] = (),
                 sources: tuple[str, ...] = ()):
        self.runtime, self.tenants = runtime, Tenants(keys)
        self.sources = tuple(sources)        #: local checkpoint directories served as models
        self.sampling = SamplingRoutes(self.tenants)
        self.http: HttpServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._routes = {
            ("POST", "/client/config"): self._client_config,
            ("POST", "/client/dynamic_config"): self._dynamic_config,
            ("POST", "/create_session"): self._create_session,
            ("POST", "/session_heartbeat"): self._heartbeat,
            ("POST", "/telemetry"): self._telemetry,
            ("GET", "/healthz"): self._health,
            ("GET", "/get_server_capabilities"): self._capabilities,
            ("POST", "/retrieve_future"): self._retrieve_future,
            ("POST", "/cancel_future"): self._cancel_future,
            **ModelRoutes(self.tenants, runtime, Path(root), self.sources).routes,
            **self.sampling.routes,
        }

    # -- its thread -----------------------------------------------------------------------------
    @classmethod
    async def start(cls, host: str = "127.0.0.1", port: int = 0, **kw) -> "TinkerServer":
        """On the running loop (tests)."""
        out = cls(**kw)
        out._loop = asyncio.get_running_loop()
        out.http = await HttpServer.start(out.handle, host, port)
        return out

    @classmethod
    def start_thread(cls, host: str = "127.0.0.1", port: int = 0, **kw) -> "TinkerServer":
        """On a thread and loop of its own; returns once it listens."""
        loop = asyncio.new_event_loop()
        threading.Thread(target=loop.run_forever, name="plexrl-tinker", daemon=True).start()
        return asyncio.run_coroutine_threadsafe(cls.start(host, port, **kw), loop).result()

    def stop_thread(self) -> None:
        asyncio.run_coroutine_threadsafe(self.stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)

    @property
    def url(self) -> str:
        return self.http.url

    async def stop(self) -> None:
        await self.http.stop()

    # -- dispatch -------------------------------------------------------------------------------
    async def handle(self, request: Request) -> Reply:
        if not request.path.startswith(API + "/"):
            return error(404, f"no route {request.method} {request.path}",
                         f"point the SDK at the server's base URL ({API} is added by it)")
        path = request.path[len(API):]
        if path == "/healthz":
            return await self._health(request, "")
        key = request.headers.get("x-api-key", "")
        if not self.tenants.allowed(key):
            return error(401, "unknown API key",
                         f"set TINKER_API_KEY to a key of this server (starting {KEY_PREFIX!r})")
        finish = re.fullmatch(r"/sessions/([^/]+)/finish", path)
        if finish and request.method == "POST":
            return await self._finish(request, key, finish.group(1))
        sampler = re.fullmatch(r"/samplers/([^/]+)", path)
        if sampler and request.method == "GET":
            return self.sampling.get_sampler(key, sampler.group(1))
        route = self._routes.get((request.method, path))
        if route is None:
            return error(404, f"this server does not serve {request.method} {path}",
                         f"use the tinker SDK {SDK_VERSION}; docs/tinker-protocol.md lists "
                         "the calls served")
        try:
            return await route(request, key)
        except (UserError, wire.WireError, PlexError) as err:   # each says its fix
            return Reply(400, {"detail": str(err)})
        except NotFound as err:
            return error(404, str(err), err.fix)

    # -- a session's life -------------------------------------------------------------------------
    async def _client_config(self, request: Request, key: str) -> Reply:
        return Reply(body={"pjwt_auth_enabled": False, "sample_cancel_enabled": False,
                           "proto_compress_fwdbwd": False})

    async def _dynamic_config(self, request: Request, key: str) -> Reply:
        return Reply(body={"refresh_interval_sec": 300, "sample_cancel_enabled": False})

    async def _create_session(self, request: Request, key: str) -> Reply:
        now = time.time()
        session_id = f"plexrl-{secrets.token_hex(8)}"
        self.tenants.sessions[session_id] = Session(key, now, now)
        return Reply(body={"session_id": session_id})

    async def _heartbeat(self, request: Request, key: str) -> Reply:
        session_id = body_of(request).get("session_id")
        session = self.tenants.session(key, session_id)
        if session is None:
            return error(404, f"no session {session_id!r} of this key",
                         "create a session with this key first (ServiceClient does)")
        if session.finished:   # 410 stops the SDK's heartbeat loop
            return error(410, f"session {session_id} is finished", "create a new session")
        session.heartbeat_s = time.time()
        return Reply(body={"type": "session_heartbeat"})

    async def _finish(self, request: Request, key: str, session_id: str) -> Reply:
        """The session's models end: their jobs release every State and binding."""
        session = self.tenants.session(key, session_id)
        if session is None:
            return error(404, f"no session {session_id!r} of this key",
                         "finish a session this key created")
        reason = body_of(request).get("reason") or {}
        session.finished = str(reason.get("type", "success")) if isinstance(reason, dict) \
            else "success"
        for model in [m for m in self.tenants.models.values() if m.session_id == session_id]:
            await self._end(model)
        return Reply(body={})

    async def _end(self, model: TinkerModel) -> None:
        if not model.ended:
            model.ended = True
            await asyncio.get_running_loop().run_in_executor(None, model.job.end)

    async def _telemetry(self, request: Request, key: str) -> Reply:
        return Reply(body={"status": "accepted"})   # kept nowhere: no telemetry leaves here

    # -- the server -------------------------------------------------------------------------------
    async def _health(self, request: Request, key: str) -> Reply:
        return Reply(body={"status": "ok"})

    async def _capabilities(self, request: Request, key: str) -> Reply:
        from plexrl.runtime.models import BUILTIN_CONFIGS   # torch, only when asked
        models = [{"model_name": name, "trainable": True, "sampleable": True,
                   "max_context_length": int(kwargs.get("max_position_embeddings", 0)) or None}
                  for name, (_, kwargs) in sorted(BUILTIN_CONFIGS.items())]
        models += [{"model_name": source, "trainable": True, "sampleable": True}
                   for source in self.sources]
        return Reply(body={"supported_models": models})

    # -- futures ----------------------------------------------------------------------------------
    async def _retrieve_future(self, request: Request, key: str) -> Reply:
        request_id = body_of(request).get("request_id")
        found, outcome = await self.tenants.futures.retrieve(key, str(request_id))
        if not found:
            return error(404, f"no request {request_id!r} of this key",
                         "poll a request_id this key was given")
        return outcome if isinstance(outcome, Reply) else Reply(body=outcome)

    async def _cancel_future(self, request: Request, key: str) -> Reply:
        self.tenants.futures.cancel(key, str(body_of(request).get("request_id")))
        return Reply(body={})
