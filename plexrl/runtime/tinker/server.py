"""The Tinker routes: what the official ``tinker`` SDK (0.38.0) asks a server, answered.

Owns: the tenants' keys (``X-API-Key``, a ``tml-`` key as the SDK requires; any such key is
a tenant unless ``RuntimeConfig.tinker_api_keys`` lists the allowed ones), the sessions a key
creates, the models, samplers and checkpoints of each key (another key's are not found), and
the routes: a session's life (client config, dynamic config, create session, heartbeat,
finish, telemetry), models (create, get_info, forward, forward_backward, optim_step, save,
save for sampler, load, weights_info), sampling (create_sampling_session, samplers/{id},
asample) and futures (retrieve, cancel), the health check and the capabilities (the built-in
model configs and the checkpoint directories the config names). A call that runs on a model
is issued to its PlexRL job (``training.py``) and answered as a future (``futures.py``); the
HTTP loop never waits on one. It runs on its own thread and loop (``start_thread``), so
decoding bodies never holds up the controller's.
Errors are JSON bodies with the status the SDK maps to its own exception (400
``BadRequestError``, 401 ``AuthenticationError``, 404 ``NotFoundError``), or, for a call
that fails once running, ``{"error", "category"}`` (``RequestFailedError``); each says
what was wrong and how to fix it.
Must not know: scheduling, Ray, torch (model configs are read when a model is created).
"""

from __future__ import annotations

import asyncio
import re
import secrets
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from plexrl.errors import PlexError
from plexrl.protocol import Role
from plexrl.runtime.tinker import batches, wire
from plexrl.runtime.tinker.futures import Futures, UserError
from plexrl.runtime.tinker.http import HttpServer, Reply, Request
from plexrl.runtime.tinker.training import (SCHEME, Checkpoint, Sampler, TinkerModel,
                                            check_name, checked, in_turn,
                                            tinker_path)

API = "/api/v1"
SDK_VERSION = "0.38.0"           #: the SDK whose wire protocol this serves
KEY_PREFIX = "tml-"              #: the SDK refuses other keys before sending them
PROTO = "application/x-protobuf"


@dataclass
class Session:
    key: str
    created_s: float
    heartbeat_s: float
    finished: str = ""           #: the reason it was finished with ("" while open)


def _error(status: int, what: str, fix: str) -> Reply:
    return Reply(status, {"detail": f"{what}; fix: {fix}"})


class TinkerServer:
    """``TinkerServer.start_thread(runtime, root, host, port, keys, sources)``; ``url``;
    ``stop_thread()``. ``runtime`` is a ``plexrl.client.Runtime`` whose jobs the models
    become; ``root`` holds the checkpoints."""

    def __init__(self, runtime=None, root: str | Path = "", keys: tuple[str, ...] = (),
                 sources: tuple[str, ...] = ()):
        self.runtime, self.root = runtime, Path(root)
        self.keys = frozenset(keys)
        self.sources = tuple(sources)        #: local checkpoint directories served as models
        self.sessions: dict[str, Session] = {}
        self.models: dict[str, TinkerModel] = {}
        self.samplers: dict[str, Sampler] = {}
        self.checkpoints: dict[str, Checkpoint] = {}
        self.futures = Futures(f"plexrl-{secrets.token_hex(4)}")
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
            ("POST", "/create_model"): self._create_model,
            ("POST", "/get_info"): self._get_info,
            ("POST", "/forward_backward"): self._forward_backward,
            ("POST", "/optim_step"): self._optim_step,
            ("POST", "/save_weights"): self._save_weights,
            ("POST", "/save_weights_for_sampler"): self._save_for_sampler,
            ("POST", "/load_weights"): self._load_weights,
            ("POST", "/weights_info"): self._weights_info,
            ("POST", "/create_sampling_session"): self._create_sampling_session,
            ("POST", "/asample"): self._asample,
            ("POST", "/retrieve_future"): self._retrieve_future,
            ("POST", "/cancel_future"): self._cancel_future,
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
        sampler = re.fullmatch(r"/samplers/([^/]+)", path)
        if sampler and request.method == "GET":
            return self._get_sampler(key, sampler.group(1))
        route = self._routes.get((request.method, path))
        if route is None:
            return _error(404, f"this server does not serve {request.method} {path}",
                          f"use the tinker SDK {SDK_VERSION}; docs/tinker-protocol.md lists "
                          "the calls served")
        try:
            return await route(request, key)
        except (UserError, wire.WireError, PlexError) as err:   # each says its fix
            return Reply(400, {"detail": str(err)})
        except _NotFound as err:
            return _error(404, str(err), err.fix)

    def _body(self, request: Request) -> dict:
        try:
            body = request.json()
        except ValueError:
            raise UserError("the body is not JSON; fix: send the SDK's request") from None
        if not isinstance(body, dict):
            raise UserError("the body is not a JSON object; fix: send the SDK's request")
        return body

    def _session(self, key: str, session_id) -> Session | None:
        session = self.sessions.get(str(session_id))
        return session if session is not None and secrets.compare_digest(session.key, key) \
            else None

    def _model(self, key: str, model_id) -> TinkerModel:
        model = self.models.get(str(model_id))
        if model is None or not secrets.compare_digest(model.key, key) or model.ended:
            raise _NotFound(f"no model {model_id!r} of this API key",
                            "use the model_id create_model gave this key")
        return model

    def _checkpoint(self, key: str, path) -> Checkpoint:
        found = self.checkpoints.get(str(path))
        if found is None or not secrets.compare_digest(found.key, key):
            raise _NotFound(f"no checkpoint {path!r} of this API key",
                            f"use a {SCHEME}... path save_weights or save_weights_for_sampler "
                            "returned to this key")
        return found

    # -- a session's life -------------------------------------------------------------------------
    async def _client_config(self, request: Request, key: str) -> Reply:
        return Reply(body={"pjwt_auth_enabled": False, "sample_cancel_enabled": False,
                           "proto_compress_fwdbwd": False})

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
        """The session's models end: their jobs release every State and binding."""
        session = self._session(key, session_id)
        if session is None:
            return _error(404, f"no session {session_id!r} of this key",
                          "finish a session this key created")
        reason = self._body(request).get("reason") or {}
        session.finished = str(reason.get("type", "success")) if isinstance(reason, dict) \
            else "success"
        for model in [m for m in self.models.values() if m.session_id == session_id]:
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

    # -- models -----------------------------------------------------------------------------------
    async def _create_model(self, request: Request, key: str) -> Reply:
        body = self._body(request)
        session_id, seq = body.get("session_id"), body.get("model_seq_id", 0)
        if self._session(key, session_id) is None:
            raise _NotFound(f"no session {session_id!r} of this key",
                            "create the training client from a ServiceClient of this key")
        lora = body.get("lora_config") or {}
        base = body.get("base_model")
        work = self._new_model(key, str(session_id), int(seq), base, lora.get("rank"),
                               int(lora.get("seed") or 0))
        model_id = await work   # checked and registered before the future is answered
        return self._future(key, _value({"model_id": model_id, "type": "create_model"}),
                            model_id=model_id)

    async def _new_model(self, key: str, session_id: str, seq: int, base, rank,
                         seed: int) -> str:
        from plexrl.runtime.models import hf_config, model_spec   # torch, only when asked
        from plexrl.runtime.models import BUILTIN_CONFIGS
        served = sorted(BUILTIN_CONFIGS) + list(self.sources)
        if base not in served:
            raise UserError(f"base_model {base!r} is not served here; fix: use one of {served} "
                            "(get_server_capabilities lists them)")
        config = hf_config(base)
        if not isinstance(rank, int) or isinstance(rank, bool) or \
                not 1 <= rank <= config.hidden_size:
            raise UserError(f"LoRA rank {rank!r} does not fit {base} (hidden size "
                            f"{config.hidden_size}); fix: a rank from 1 to "
                            f"{config.hidden_size}")
        model_id = f"{session_id}:train:{seq}"
        if model_id in self.models:
            raise UserError(f"model {model_id} exists; fix: a new model_seq_id")
        spec = model_spec("policy", base)
        loop = asyncio.get_running_loop()
        job = await loop.run_in_executor(None, lambda: self.runtime.register_job(
            f"tinker-{session_id}-{seq}", {Role.POLICY: spec}, seed=seed))
        self.models[model_id] = TinkerModel(model_id, key, session_id, base, rank, seed,
                                            int(config.vocab_size), job,
                                            arch=type(config).__name__)
        return model_id

    async def _get_info(self, request: Request, key: str) -> Reply:
        return Reply(body=self._model(key, self._body(request).get("model_id")).info())

    async def _forward_backward(self, request: Request, key: str) -> Reply:
        if request.headers.get("content-type", "").startswith(PROTO):
            if request.headers.get("content-encoding"):
                raise UserError("a compressed forward_backward body; fix: leave "
                                "proto_compress_fwdbwd off (this server's client config)")
            call = wire.read_forward_backward(request.body)
        else:
            call = wire.read_forward_backward_json(self._body(request))
        model = self._model(key, call.model_id)
        args, batch = checked(model.turns, call.seq_id, lambda: (
            batches.loss_args(call.loss_fn, call.config),
            batches.batch_of(call.loss_fn, call.data, model.vocab_size)))
        lengths = [len(d.tokens) for d in call.data]

        def issue():
            if call.forward_only:
                return model.job.logprobs(batch, loss=call.loss_fn, **args)
            return model.job.forward_backward(batch, loss=call.loss_fn, **args)

        async def run():
            out = await asyncio.wrap_future(await in_turn(model.turns, call.seq_id, issue))
            metrics = {"loss:sum": out["loss"]}
            logprobs = [out["logprobs"][i, :n] for i, n in enumerate(lengths)]
            return Reply(body=wire.write_forward_backward_output(
                call.loss_fn, metrics, {"logprobs": logprobs}), content_type=PROTO)
        return self._ordered(key, model.requests, call.seq_id, run)

    async def _optim_step(self, request: Request, key: str) -> Reply:
        body = self._body(request)
        model = self._model(key, body.get("model_id"))
        hyper = checked(model.turns, body.get("seq_id"), lambda: _adam(body.get("adam_params")))

        def issue():
            model.version += 1
            return model.job.optim_step(**hyper)

        async def run():
            out = await asyncio.wrap_future(await in_turn(model.turns, body.get("seq_id"), issue))
            return {"metrics": {"grad_norm:mean": out["grad_norm"]}, "type": "optim_step"}
        return self._ordered(key, model.requests, body.get("seq_id"), run)

    def _save(self, model: TinkerModel, kind: str, name: str, key: str) -> Checkpoint:
        path = tinker_path(model.model_id, kind, name)
        folder = self.root / model.model_id.replace(":", "-") / kind
        folder.mkdir(parents=True, exist_ok=True)
        return Checkpoint(path, str(folder / f"{name}.safetensors"), key, model.model_id,
                          model.base_model, model.rank, model.seed, model.version)

    async def _save_weights(self, request: Request, key: str) -> Reply:
        body = self._body(request)
        model = self._model(key, body.get("model_id"))

        def check() -> Checkpoint:
            checkpoint = self._save(model, "weights", check_name(body.get("path")), key)
            if checkpoint.path in self.checkpoints and not body.get("overwrite"):
                raise UserError(f"{checkpoint.path} exists; fix: another name, or "
                                "overwrite=True")
            return checkpoint
        checkpoint = checked(model.turns, body.get("seq_id"), check)

        def issue():
            return model.job.save(checkpoint.file)

        async def run():
            await asyncio.wrap_future(await in_turn(model.turns, body.get("seq_id"), issue))
            checkpoint.record()
            self.checkpoints[checkpoint.path] = checkpoint
            return {"path": checkpoint.path, "type": "save_weights"}
        return self._ordered(key, model.requests, body.get("seq_id"), run)

    async def _save_for_sampler(self, request: Request, key: str) -> Reply:
        """The model's weights as of its calls so far go to its rollout copy (a SYNC_WEIGHTS);
        a name also writes them to a ``sampler_weights`` checkpoint; without one the reply
        is a sampling session on them."""
        body = self._body(request)
        model = self._model(key, body.get("model_id"))
        name = body.get("path")
        checkpoint = None if name is None else checked(
            model.turns, body.get("seq_id"),
            lambda: self._save(model, "sampler_weights", check_name(name), key))

        def issue():
            synced = _done(None)
            if model.synced != model.version:   # the rollout copy has older weights
                model.synced, synced = model.version, model.job.sync_weights()
            return synced if checkpoint is None else model.job.save(checkpoint.file)

        async def run():
            version = model.version
            await asyncio.wrap_future(await in_turn(model.turns, body.get("seq_id"), issue))
            if checkpoint is None:
                sampler = self._sampler(key, model, version,
                                        f"{model.session_id}:sample:"
                                        f"{body.get('sampling_session_seq_id', 0)}")
                return {"sampling_session_id": sampler.sampler_id,
                        "type": "save_weights_for_sampler"}
            checkpoint.record()
            self.checkpoints[checkpoint.path] = checkpoint
            return {"path": checkpoint.path, "type": "save_weights_for_sampler"}
        return self._ordered(key, model.requests, body.get("seq_id"), run)

    async def _load_weights(self, request: Request, key: str) -> Reply:
        """Into a model (``model_id``), or into a new one made from the checkpoint's base
        (``session_id`` + ``model_seq_id``: ``create_training_client_from_state``)."""
        body = self._body(request)
        if body.get("model_id") is not None:   # a call of the model's own order
            model = self._model(key, body.get("model_id"))
            checkpoint = checked(model.turns, body.get("seq_id"),
                                 lambda: self._loadable(key, body.get("path"), model))
        else:
            checkpoint = self._checkpoint(key, body.get("path"))
        optimizer = bool(body.get("optimizer", False))
        if body.get("model_id") is None:
            if self._session(key, body.get("session_id")) is None:
                raise _NotFound(f"no session {body.get('session_id')!r} of this key",
                                "load from a ServiceClient of this key")
            model_id = await self._new_model(key, str(body["session_id"]),
                                             int(body.get("model_seq_id", 0)),
                                             checkpoint.base_model, checkpoint.rank,
                                             checkpoint.seed)
            model = self.models[model_id]
            seq = None   # before the client's first call (it is made once this answers)
        else:
            seq = body.get("seq_id")

        def issue():
            model.version = checkpoint.version if optimizer else model.version + 1
            return model.job.load(checkpoint.file, optimizer=optimizer,
                                  version=checkpoint.version if optimizer else 0)

        async def run():
            issued = issue() if seq is None else await in_turn(model.turns, seq, issue)
            await asyncio.wrap_future(issued)
            return {"path": checkpoint.path, "model_id": model.model_id, "type": "load_weights"}
        if seq is None:
            return self._future(key, run(), model_id=model.model_id)
        return self._ordered(key, model.requests, seq, run, model_id=model.model_id)

    def _loadable(self, key: str, path, model: TinkerModel) -> Checkpoint:
        checkpoint = self._checkpoint(key, path)
        if model.base_model != checkpoint.base_model or model.rank != checkpoint.rank:
            raise UserError(f"{checkpoint.path} holds {checkpoint.base_model} rank "
                            f"{checkpoint.rank}, the model is {model.base_model} rank "
                            f"{model.rank}; fix: load it into a model of that base and rank")
        return checkpoint

    async def _weights_info(self, request: Request, key: str) -> Reply:
        return Reply(body=self._checkpoint(key, self._body(request).get("tinker_path"))
                     .weights_info())

    # -- sampling ---------------------------------------------------------------------------------
    def _sampler(self, key: str, model: TinkerModel, version: int, sampler_id: str,
                 model_path: str = "") -> Sampler:
        if sampler_id in self.samplers:
            sampler_id = f"{sampler_id}-{secrets.token_hex(3)}"
        sampler = Sampler(sampler_id, key, model, version, model_path)
        self.samplers[sampler_id] = sampler
        return sampler

    async def _create_sampling_session(self, request: Request, key: str) -> Reply:
        body = self._body(request)
        if self._session(key, body.get("session_id")) is None:
            raise _NotFound(f"no session {body.get('session_id')!r} of this key",
                            "create the sampling client from a ServiceClient of this key")
        path = body.get("model_path")
        if path is None:
            raise UserError("sampling a base model with no training client is not served "
                            "yet; fix: training_client.save_weights_and_get_sampling_client()")
        checkpoint = self._checkpoint(key, path)
        model = self.models.get(checkpoint.model_id)
        if model is None or model.ended or "/sampler_weights/" not in checkpoint.path:
            raise UserError(f"{path} is not the sampler weights of a live model; fix: "
                            "save_weights_for_sampler on a training client that is still open")
        sampler = self._sampler(key, model, checkpoint.version,
                                f"{body['session_id']}:sample:"
                                f"{body.get('sampling_session_seq_id', 0)}", path)
        return Reply(body={"sampling_session_id": sampler.sampler_id})

    def _get_sampler(self, key: str, sampler_id: str) -> Reply:
        sampler = self.samplers.get(sampler_id)
        if sampler is None or not secrets.compare_digest(sampler.key, key):
            return _error(404, f"no sampler {sampler_id!r} of this key",
                          "use a sampling_session_id this key created")
        return Reply(body={"sampler_id": sampler_id, "base_model": sampler.model.base_model,
                           "model_path": sampler.model_path or None})

    async def _asample(self, request: Request, key: str) -> Reply:
        body = self._body(request)
        sampler = self.samplers.get(str(body.get("sampling_session_id")))
        if sampler is None or not secrets.compare_digest(sampler.key, key):
            raise _NotFound(f"no sampling session {body.get('sampling_session_id')!r} of this "
                            "key", "sample from a sampling client this key created")
        seq = body.get("seq_id", 0)
        prompt, params, n, stop = checked(sampler.turns, seq,
                                          lambda: self._sample_args(body, sampler.model))
        want_prompt = bool(body.get("prompt_logprobs"))
        prompts = [prompt.tolist()] * n
        model = sampler.model

        def issue():
            if want_prompt and model.version != sampler.version:
                raise UserError(f"prompt logprobs of weights version {sampler.version}, but "
                                f"the model has moved on to {model.version}; fix: ask for them "
                                "before the next optim_step, or from a new sampling client")
            generated = model.job.generate(
                prompts, step=sampler.version, max_tokens=params["max_tokens"],
                temperature=float(params.get("temperature", 1.0)),
                top_p=float(params.get("top_p", 1.0)), stop=stop)
            scored = model.job.logprobs({"input_ids": np.asarray([prompt])}) \
                if want_prompt else None
            return generated, scored

        async def run():
            generated, scored = await in_turn(sampler.turns, seq, issue)
            out = await asyncio.wrap_future(generated)
            lengths = [int(v) for v in out["lengths"]]
            prompt_lps = None
            if scored is not None:
                prompt_lps = np.array((await asyncio.wrap_future(scored))["logprobs"][0],
                                      np.float32)
                prompt_lps[0] = np.nan
            return Reply(body=wire.write_sample_response(
                [out["tokens"][i, :k] for i, k in enumerate(lengths)],
                [out["logprobs"][i, :k] for i, k in enumerate(lengths)],
                [bool(s) for s in out["stopped"]], prompt_lps), content_type=PROTO)
        reply = self._ordered(key, sampler.requests, seq, run)
        request_id = reply.body["request_id"]
        return Reply(body={**reply.body,
                           "sample_sequence_ids": [f"{request_id}:{i}" for i in range(n)]})

    @staticmethod
    def _sample_args(body: dict, model: TinkerModel):
        prompt = wire.read_model_input("prompt", body.get("prompt"))
        params = body.get("sampling_params") or {}
        n, max_tokens = body.get("num_samples", 1), params.get("max_tokens")
        if not prompt.size or prompt.min() < 0 or prompt.max() >= model.vocab_size:
            raise UserError(f"the prompt must be tokens in [0, {model.vocab_size}); fix: use "
                            "the model's tokenizer")
        if not isinstance(n, int) or n < 1 or not isinstance(max_tokens, int) or max_tokens < 1:
            raise UserError("num_samples and sampling_params.max_tokens must be >= 1; fix: "
                            "SamplingParams(max_tokens=...)")
        if params.get("top_k", -1) not in (-1, None, 0) or body.get("topk_prompt_logprobs"):
            raise UserError("top-k sampling and top-k prompt logprobs are not served; fix: "
                            "top_k=-1 and topk_prompt_logprobs=0")
        stop = params.get("stop") or ()
        if isinstance(stop, str) or not all(isinstance(t, int) for t in stop):
            raise UserError("stop must be token ids here (no tokenizer on the server); fix: "
                            "SamplingParams(stop=[token_id, ...])")
        return prompt, params, n, tuple(stop)

    # -- futures ----------------------------------------------------------------------------------
    def _future(self, key: str, work, **extra) -> Reply:
        return Reply(body={"request_id": self.futures.add(key, work), **extra})

    def _ordered(self, key: str, requests: dict, seq, run, **extra) -> Reply:
        """A future for the call numbered ``seq``; a resend of one is the same future."""
        if not isinstance(seq, int) or isinstance(seq, bool):
            raise UserError(f"seq_id {seq!r} is not an integer; fix: send the SDK's request")
        if seq in requests:
            return Reply(body={"request_id": requests[seq], **extra})
        reply = self._future(key, run(), **extra)
        requests[seq] = reply.body["request_id"]
        return reply

    async def _retrieve_future(self, request: Request, key: str) -> Reply:
        request_id = self._body(request).get("request_id")
        found, outcome = await self.futures.retrieve(key, str(request_id))
        if not found:
            return _error(404, f"no request {request_id!r} of this key",
                          "poll a request_id this key was given")
        return outcome if isinstance(outcome, Reply) else Reply(body=outcome)

    async def _cancel_future(self, request: Request, key: str) -> Reply:
        self.futures.cancel(key, str(self._body(request).get("request_id")))
        return Reply(body={})


def _adam(adam) -> dict:
    """The engine's AdamW arguments of Tinker's ``AdamParams``."""
    if not isinstance(adam, dict) or "learning_rate" not in adam:
        raise UserError("optim_step needs adam_params with a learning_rate; fix: pass "
                        "tinker.AdamParams(learning_rate=...)")
    clip = float(adam.get("grad_clip_norm") or 0.0)
    return dict(lr=float(adam["learning_rate"]),
                betas=(float(adam.get("beta1", 0.9)), float(adam.get("beta2", 0.95))),
                eps=float(adam.get("eps", 1e-12)), weight_decay=float(adam.get("weight_decay", 0.0)),
                max_grad_norm=clip if clip > 0 else None)


class _NotFound(Exception):
    def __init__(self, what: str, fix: str):
        super().__init__(what)
        self.fix = fix


async def _value(value):
    return value


def _done(value) -> Future:
    out: Future = Future()
    out.set_result(value)
    return out
