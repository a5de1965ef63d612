"""Whose is what on the Tinker server: the tenants' keys, and each key's sessions, models,
samplers, checkpoints and futures.

Owns: which keys are tenants (``X-API-Key``, a ``tml-`` key as the SDK requires; any such key
unless ``RuntimeConfig.tinker_api_keys`` lists the allowed ones), the lookups (a key finds
only its own; another key's are not found, 404), the request id of each numbered call (a
resend of one is the same future), and the error replies, each saying what was wrong and
how to fix it.
Must not know: what a call does, the routes, the wire format.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from plexrl.runtime.tinker.futures import Futures, UserError
from plexrl.runtime.tinker.http import Reply, Request
from plexrl.runtime.tinker.training import SCHEME, Checkpoint, Sampler, TinkerModel

KEY_PREFIX = "tml-"              #: the SDK refuses other keys before sending them


@dataclass
class Session:
    key: str
    created_s: float
    heartbeat_s: float
    finished: str = ""           #: the reason it was finished with ("" while open)


class NotFound(Exception):
    """Answered 404 (the SDK's ``NotFoundError``)."""

    def __init__(self, what: str, fix: str):
        super().__init__(what)
        self.fix = fix


def error(status: int, what: str, fix: str) -> Reply:
    return Reply(status, {"detail": f"{what}; fix: {fix}"})


def body_of(request: Request) -> dict:
    try:
        body = request.json()
    except ValueError:
        raise UserError("the body is not JSON; fix: send the SDK's request") from None
    if not isinstance(body, dict):
        raise UserError("the body is not a JSON object; fix: send the SDK's request")
    return body


class Tenants:
    def __init__(self, keys: tuple[str, ...] = ()):
        self.keys = frozenset(keys)
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, TinkerModel] = {}
        self.samplers: dict[str, Sampler] = {}
        self.checkpoints: dict[str, Checkpoint] = {}
        self.futures = Futures(f"plexrl-{secrets.token_hex(4)}")

    def allowed(self, key: str) -> bool:
        return key.startswith(KEY_PREFIX) and (not self.keys or key in self.keys)

    def session(self, key: str, session_id) -> Session | None:
        session = self.sessions.get(str(session_id))
        return session if session is not None and secrets.compare_digest(session.key, key) \
            else None

    def own_session(self, key: str, session_id, fix: str) -> Session:
        session = self.session(key, session_id)
        if session is None:
            raise NotFound(f"no session {session_id!r} of this key", fix)
        return session

    def model(self, key: str, model_id) -> TinkerModel:
        model = self.models.get(str(model_id))
        if model is None or not secrets.compare_digest(model.key, key) or model.ended:
            raise NotFound(f"no model {model_id!r} of this API key",
                           "use the model_id create_model gave this key")
        return model

    def checkpoint(self, key: str, path) -> Checkpoint:
        found = self.checkpoints.get(str(path))
        if found is None or not secrets.compare_digest(found.key, key):
            raise NotFound(f"no checkpoint {path!r} of this API key",
                           f"use a {SCHEME}... path save_weights or save_weights_for_sampler "
                           "returned to this key")
        return found

    def sampler(self, key: str, sampler_id) -> Sampler | None:
        sampler = self.samplers.get(str(sampler_id))
        return sampler if sampler is not None and secrets.compare_digest(sampler.key, key) \
            else None

    def new_sampler(self, key: str, model: TinkerModel, version: int, sampler_id: str,
                    model_path: str = "") -> Sampler:
        if sampler_id in self.samplers:
            sampler_id = f"{sampler_id}-{secrets.token_hex(3)}"
        sampler = Sampler(sampler_id, key, model, version, model_path)
        self.samplers[sampler_id] = sampler
        return sampler

    def future(self, key: str, work, **extra) -> Reply:
        return Reply(body={"request_id": self.futures.add(key, work), **extra})

    def ordered(self, key: str, requests: dict, seq, run, **extra) -> Reply:
        """A future for the call numbered ``seq``; a resend of one is the same future."""
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise UserError(f"seq_id {seq!r} is not an integer; fix: send the SDK's request")
        if seq in requests:
            return Reply(body={"request_id": requests[seq], **extra})
        reply = self.future(key, run(), **extra)
        requests[seq] = reply.body["request_id"]
        return reply
