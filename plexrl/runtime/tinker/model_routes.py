"""The Tinker routes on a model: a training client's calls, each issued to its PlexRL job.

Owns: ``create_model`` (a job ``tinker-{session}-{n}`` of one policy: LoRA adapters of the
asked rank and parts on the base model, which the worker group holds once for every LoRA job
on it), ``get_info``, ``forward`` and ``forward_backward`` (protobuf or JSON;
the SDK's loss names and fields, ``batches.py``), ``optim_step`` (Tinker's ``AdamParams``
as the engine's AdamW), ``save_weights``, ``save_weights_for_sampler`` (a SYNC_WEIGHTS to
the rollout copy, and a sampling session or a ``sampler_weights`` checkpoint),
``load_weights`` (into a model, or a new model made from the checkpoint) and
``weights_info``. Each call is issued in its model's ``seq_id`` order (``training.py``) and
answered as a future; the HTTP loop never waits on one.
Must not know: scheduling, Ray, torch (model configs are read when a model is created).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from pathlib import Path

from plexrl.protocol import Role
from plexrl.runtime.tinker import batches, wire
from plexrl.runtime.tinker.futures import UserError
from plexrl.runtime.tinker.http import Reply, Request
from plexrl.runtime.tinker.tenants import Tenants, body_of
from plexrl.runtime.tinker.training import (Checkpoint, TinkerModel, check_name, checked,
                                            in_turn, tinker_path)

PROTO = "application/x-protobuf"


class ModelRoutes:
    """``routes``: ``{(method, path): handler}``; ``runtime`` (a ``plexrl.client.Runtime``)
    is where the models become jobs, ``root`` holds the checkpoints, ``sources`` are the
    local checkpoint directories served as base models."""

    def __init__(self, tenants: Tenants, runtime, root: Path, sources: tuple[str, ...]):
        self.tenants, self.runtime, self.root, self.sources = tenants, runtime, root, sources
        self.routes = {
            ("POST", "/create_model"): self.create_model,
            ("POST", "/get_info"): self.get_info,
            ("POST", "/forward_backward"): self.forward_backward,
            ("POST", "/optim_step"): self.optim_step,
            ("POST", "/save_weights"): self.save_weights,
            ("POST", "/save_weights_for_sampler"): self.save_for_sampler,
            ("POST", "/load_weights"): self.load_weights,
            ("POST", "/weights_info"): self.weights_info,
        }

    async def create_model(self, request: Request, key: str) -> Reply:
        body = body_of(request)
        session_id, seq = body.get("session_id"), body.get("model_seq_id", 0)
        self.tenants.own_session(key, session_id,
                                 "create the training client from a ServiceClient of this key")
        lora = body.get("lora_config") or {}
        parts = tuple(part for part, flag in (("attn", "train_attn"), ("mlp", "train_mlp"),
                                              ("unembed", "train_unembed"))
                      if lora.get(flag, True))
        if not parts:
            raise UserError("the LoRA config trains nothing; fix: leave at least one of "
                            "train_attn, train_mlp, train_unembed true")
        # checked and registered before the future is answered
        model_id = await self.new_model(key, str(session_id), int(seq), body.get("base_model"),
                                        lora.get("rank"), int(lora.get("seed") or 0), parts)
        return self.tenants.future(key, _value({"model_id": model_id, "type": "create_model"}),
                                   model_id=model_id)

    async def new_model(self, key: str, session_id: str, seq: int, base, rank,
                        seed: int, parts: tuple[str, ...]) -> str:
        """A LoRA job of ``rank`` on ``parts`` of ``base`` (D215), registered and placed."""
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
        if model_id in self.tenants.models:
            raise UserError(f"model {model_id} exists; fix: a new model_seq_id")
        spec = model_spec("policy", base, lora_rank=rank, lora_targets=parts)
        loop = asyncio.get_running_loop()
        job = await loop.run_in_executor(None, lambda: self.runtime.register_job(
            f"tinker-{session_id}-{seq}", {Role.POLICY: spec}, seed=seed))
        self.tenants.models[model_id] = TinkerModel(
            model_id, key, session_id, base, rank, seed, int(config.vocab_size), job,
            arch=type(config).__name__, parts=parts)
        return model_id

    async def get_info(self, request: Request, key: str) -> Reply:
        return Reply(body=self.tenants.model(key, body_of(request).get("model_id")).info())

    async def forward_backward(self, request: Request, key: str) -> Reply:
        if request.headers.get("content-type", "").startswith(PROTO):
            if request.headers.get("content-encoding"):
                raise UserError("a compressed forward_backward body; fix: leave "
                                "proto_compress_fwdbwd off (this server's client config)")
            call = wire.read_forward_backward(request.body)
        else:
            call = wire.read_forward_backward_json(body_of(request))
        model = self.tenants.model(key, call.model_id)
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
        return self.tenants.ordered(key, model.requests, call.seq_id, run)

    async def optim_step(self, request: Request, key: str) -> Reply:
        body = body_of(request)
        model = self.tenants.model(key, body.get("model_id"))
        hyper = checked(model.turns, body.get("seq_id"), lambda: _adam(body.get("adam_params")))

        def issue():
            model.version += 1
            return model.job.optim_step(**hyper)

        async def run():
            out = await asyncio.wrap_future(await in_turn(model.turns, body.get("seq_id"), issue))
            return {"metrics": {"grad_norm:mean": out["grad_norm"]}, "type": "optim_step"}
        return self.tenants.ordered(key, model.requests, body.get("seq_id"), run)

    def save(self, model: TinkerModel, kind: str, name: str, key: str) -> Checkpoint:
        path = tinker_path(model.model_id, kind, name)
        folder = self.root / model.model_id.replace(":", "-") / kind
        folder.mkdir(parents=True, exist_ok=True)
        return Checkpoint(path, str(folder / f"{name}.safetensors"), key, model.model_id,
                          model.base_model, model.rank, model.seed, model.version, model.parts)

    async def save_weights(self, request: Request, key: str) -> Reply:
        body = body_of(request)
        model = self.tenants.model(key, body.get("model_id"))

        def check() -> Checkpoint:
            checkpoint = self.save(model, "weights", check_name(body.get("path")), key)
            if checkpoint.path in self.tenants.checkpoints and not body.get("overwrite"):
                raise UserError(f"{checkpoint.path} exists; fix: another name, or "
                                "overwrite=True")
            return checkpoint
        checkpoint = checked(model.turns, body.get("seq_id"), check)

        def issue():
            return model.job.save(checkpoint.file)

        async def run():
            await asyncio.wrap_future(await in_turn(model.turns, body.get("seq_id"), issue))
            checkpoint.record()
            self.tenants.checkpoints[checkpoint.path] = checkpoint
            return {"path": checkpoint.path, "type": "save_weights"}
        return self.tenants.ordered(key, model.requests, body.get("seq_id"), run)

    async def save_for_sampler(self, request: Request, key: str) -> Reply:
        """The model's weights as of its calls so far go to its rollout copy (a SYNC_WEIGHTS);
        a name also writes them to a ``sampler_weights`` checkpoint; without one the reply
        is a sampling session on them."""
        body = body_of(request)
        model = self.tenants.model(key, body.get("model_id"))
        name = body.get("path")
        checkpoint = None if name is None else checked(
            model.turns, body.get("seq_id"),
            lambda: self.save(model, "sampler_weights", check_name(name), key))

        def issue():
            synced = _done(None)
            if model.synced != model.version:   # the rollout copy has older weights
                model.synced, synced = model.version, model.job.sync_weights()
            return synced if checkpoint is None else model.job.save(checkpoint.file)

        async def run():
            version = model.version
            await asyncio.wrap_future(await in_turn(model.turns, body.get("seq_id"), issue))
            if checkpoint is None:
                sampler = self.tenants.new_sampler(key, model, version,
                                                   f"{model.session_id}:sample:"
                                                   f"{body.get('sampling_session_seq_id', 0)}")
                return {"sampling_session_id": sampler.sampler_id,
                        "type": "save_weights_for_sampler"}
            checkpoint.record()
            self.tenants.checkpoints[checkpoint.path] = checkpoint
            return {"path": checkpoint.path, "type": "save_weights_for_sampler"}
        return self.tenants.ordered(key, model.requests, body.get("seq_id"), run)

    async def load_weights(self, request: Request, key: str) -> Reply:
        """Into a model (``model_id``), or into a new one made from the checkpoint's base
        (``session_id`` + ``model_seq_id``: ``create_training_client_from_state``)."""
        body = body_of(request)
        if body.get("model_id") is not None:   # a call of the model's own order
            model = self.tenants.model(key, body.get("model_id"))
            checkpoint = checked(model.turns, body.get("seq_id"),
                                 lambda: self.loadable(key, body.get("path"), model))
        else:
            checkpoint = self.tenants.checkpoint(key, body.get("path"))
        optimizer = bool(body.get("optimizer", False))
        if body.get("model_id") is None:
            self.tenants.own_session(key, body.get("session_id"),
                                     "load from a ServiceClient of this key")
            model_id = await self.new_model(key, str(body["session_id"]),
                                            int(body.get("model_seq_id", 0)),
                                            checkpoint.base_model, checkpoint.rank,
                                            checkpoint.seed, checkpoint.parts)
            model = self.tenants.models[model_id]
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
            return self.tenants.future(key, run(), model_id=model.model_id)
        return self.tenants.ordered(key, model.requests, seq, run, model_id=model.model_id)

    def loadable(self, key: str, path, model: TinkerModel) -> Checkpoint:
        checkpoint = self.tenants.checkpoint(key, path)
        held, want = ((c.base_model, c.rank, c.parts) for c in (checkpoint, model))
        if held != want:
            raise UserError(f"{checkpoint.path} holds adapters of rank {held[1]} on "
                            f"{'+'.join(held[2])} of {held[0]}, the model is rank {want[1]} on "
                            f"{'+'.join(want[2])} of {want[0]}; fix: load it into a model of "
                            "that base, rank and LoRA parts")
        return checkpoint

    async def weights_info(self, request: Request, key: str) -> Reply:
        return Reply(body=self.tenants.checkpoint(key, body_of(request).get("tinker_path"))
                     .weights_info())


def _adam(adam) -> dict:
    """The engine's AdamW arguments of Tinker's ``AdamParams``."""
    if not isinstance(adam, dict) or "learning_rate" not in adam:
        raise UserError("optim_step needs adam_params with a learning_rate; fix: pass "
                        "tinker.AdamParams(learning_rate=...)")
    clip = float(adam.get("grad_clip_norm") or 0.0)
    return dict(lr=float(adam["learning_rate"]),
                betas=(float(adam.get("beta1", 0.9)), float(adam.get("beta2", 0.95))),
                eps=float(adam.get("eps", 1e-12)),
                weight_decay=float(adam.get("weight_decay", 0.0)),
                max_grad_norm=clip if clip > 0 else None)


async def _value(value):
    return value


def _done(value) -> Future:
    out: Future = Future()
    out.set_result(value)
    return out
