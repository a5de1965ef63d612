"""The Tinker routes: what the official ``tinker`` SDK (0.38.0) asks a server, answered.

Owns: the tenants' keys (``X-API-Key``, a ``tml-`` key as the SDK requires; any such key is
a tenant unless ``RuntimeConfig.tinker_api_keys`` lists the allowed ones), the sessions a key
creates (only that key may heartbeat or finish one), and the routes of a session's life
(client config, dynamic config, create session, heartbeat, finish, telemetry), the health
check and the server's capabilities (the built-in model configs). Errors are JSON bodies
with the status the SDK maps to its own exception (401 ``AuthenticationError``, 404
``NotFoundError``, 400 ``BadRequestError``), each saying what was wrong and how to fix it.
Must not know: scheduling, Ray, torch (the model configs are read when asked for).
"""

from __future__ import annotations

import re
import secrets
import time
from dataclasses import dataclass

from plexrl.runtime.tinker.http import HttpServer, Reply, Request

API = "/api/v1"
SDK_VERSION = "0.38.0"           #: the SDK whose wire protocol this serves
KEY_PREFIX = "tml-"              #: the SDK refuses other keys before sending them


@dataclass
class Session:
    key: str
    created_s: float
    heartbeat_s: float
    finished: str = ""           #: the reason it was finished with ("" while open)


def _error(status: int, what: str, fix: str) -> Reply:
    return Reply(status, {"detail": f"{what}; fix: {fix}"})


class TinkerServer:
    """``await TinkerServer.start(host, port, keys)``; ``url``; ``await stop()``."""

    def __init__(self, keys: tuple[str, ...] = ()):
        self.keys = frozenset(keys)
        self.sessions: dict[str, Session] = {}
        self.http: HttpServer | None = None
        self._routes = {
            ("POST", "/client/config"): self._client_config,
            ("POST", "/client/dynamic_config"): self._dynamic_config,
            ("POST", "/create_session"): self._create_session,
            ("POST", "/session_heartbeat"): self._heartbeat,
            ("POST", "/telemetry"): self._telemetry,
            ("GET", "/healthz"): self._health,
            ("GET", "/get_server_capabilities"): self._capabilities,
        }

    @classmethod
    async def start(cls, host: str = "127.0.0.1", port: int = 0,
                    keys: tuple[str, ...] = ()) -> "TinkerServer":
        out = cls(keys)
        out.http = await HttpServer.start(out.handle, host, port)
        return out

    @property
    def url(self) -> str:
        return self.http.url

    async def stop(self) -> None:
        await self.http.stop()

    # -- dispatch -------------------------------------------------------------------------------
    async def handle(self, request: Request) -> Reply:
        if not request.path.startswith(API + "/"):
            return _error(404, f"no route {request.method} {request.path}",
                          f"point the SDK at the server's base URL ({API} is added by it)")
        path = request.path[len(API):]
        if path == "/healthz":
            return await self._health(request, "")
        key = request.headers.get("x-api-key", "")
        if not key.startswith(KEY_PREFIX) or (self.keys and key not in self.keys):
            return _error(401, "unknown API key",
                          f"set TINKER_API_KEY to a key of this server (starting {KEY_PREFIX!r})")
        finish = re.fullmatch(r"/sessions/([^/]+)/finish", path)
        if finish and request.method == "POST":
            return await self._finish(request, key, finish.group(1))
        route = self._routes.get((request.method, path))
        if route is None:
            return _error(404, f"this server does not serve {request.method} {path}",
                          f"use the tinker SDK {SDK_VERSION}; see docs/design.md D209 for the "
                          "calls served so far")
        return await route(request, key)

    def _body(self, request: Request) -> dict:
        body = request.json()
        if not isinstance(body, dict):
            raise ValueError("the body is not a JSON object")
        return body

    def _session(self, key: str, session_id) -> Session | None:
        session = self.sessions.get(str(session_id))
        return session if session is not None and secrets.compare_digest(session.key, key) \
            else None

    # -- a session's life -------------------------------------------------------------------------
    async def _client_config(self, request: Request, key: str) -> Reply:
        return Reply(body={"pjwt_auth_enabled": False, "sample_cancel_enabled": False})

    async def _dynamic_config(self, request: Request, key: str) -> Reply:
        return Reply(body={"refresh_interval_sec": 300, "sample_cancel_enabled": False})

    async def _create_session(self, request: Request, key: str) -> Reply:
        now = time.time()
        session_id = f"plexrl-{secrets.token_hex(8)}"
        self.sessions[session_id] = Session(key, now, now)
        return Reply(body={"session_id": session_id})

    async def _heartbeat(self, request: Request, key: str) -> Reply:
        session_id = self._body(request).get("session_id")
        session = self._session(key, session_id)
        if session is None:
            return _error(404, f"no session {session_id!r} of this key",
                          "create a session with this key first (ServiceClient does)")
        if session.finished:   # 410 stops the SDK's heartbeat loop
            return _error(410, f"session {session_id} is finished", "create a new session")
        session.heartbeat_s = time.time()
        return Reply(body={"type": "session_heartbeat"})

    async def _finish(self, request: Request, key: str, session_id: str) -> Reply:
        session = self._session(key, session_id)
        if session is None:
            return _error(404, f"no session {session_id!r} of this key",
                          "finish a session this key created")
        reason = self._body(request).get("reason") or {}
        session.finished = str(reason.get("type", "success")) if isinstance(reason, dict) \
            else "success"
        return Reply(body={})

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
        return Reply(body={"supported_models": models})
