"""The service actor of one worker group: runs the calls of every job bound to it, and moves
their States between tiers when the controller says so.

Owns: the jobs bound here (their token, an ``Engine`` per model, a sampling ``torch.Generator``
per policy, the number of optimizer steps applied), the check that a call carries its job's
token and comes in its job's order, running each Function on the flat State buffers of the
``StateStore``, the device reserve a call holds while it runs, and a log of every transition
(which bytes went from which storage to which: a buffer's address, or a spill file's path,
with the checksum of spilled and restored bytes). Its spill files live under ``spill_root``.
In a worker group of n devices there is one Service per rank (``rank`` of ``world``), each
holding its shard of every State (``sharded.ShardedEngine``) and running its share of every
call; SAVE writes, and LOAD reads, whole States, so a checkpoint does not depend on n.
A plain class: ``actor.ServiceActor`` hosts it in a Ray actor, where a call computes on one
thread while prefetch copies other States on another.
Must not know: the Snapshot, policies, other worker groups, why a call or a move was chosen.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import psutil
import torch
from safetensors.torch import load_file, save_file

from plexrl.errors import CallError, PlexError
from plexrl.protocol import (FORWARD, CallId, CallRequest, Copy, Function, JobId, ModelSpec, Role,
                             State, StateKey, Tier, base_key, copy_label)
from plexrl.runtime.workers.engine import Engine
from plexrl.runtime.workers.lora import LoraEngine
from plexrl.runtime.workers.sharded import ShardedEngine
from plexrl.runtime.workers.order import (CallOrder, copies_of, hosted_job, next_seq_labels,
                                         take_turn)
from plexrl.runtime.tiers.device import DeviceMemory
from plexrl.runtime.tiers.disk import DiskStore
from plexrl.runtime.tiers.host import HostStore
from plexrl.runtime.tiers.store import StateStore


@dataclass
class HostedModel:
    engine: Engine | ShardedEngine
    #: the job's sampling generator per rollout lane here, each seeded alike: every lane
    #: draws every GENERATE's noise, so the lanes' streams stay in step (D206); lane 0's is
    #: the one SAVE writes and LOAD restores
    generators: dict[int, torch.Generator]
    initial_weights: torch.Tensor | None  #: version 0 of both copies, until both exist
    bound: set[tuple[Copy, int]] = field(default_factory=set)   #: (copy, lane) bound here
    optim_steps: int = 0         #: OPTIM_STEPs applied to the trainer copy
    rollout_versions: dict[int, int] = field(default_factory=dict)  #: installed, per lane

    @property
    def generator(self) -> torch.Generator:
        return self.generators[0]


@dataclass
class HostedJob:
    token: str
    models: dict[Role, HostedModel] = field(default_factory=dict)
    next_seq: dict[tuple, int] = field(default_factory=dict)  #: per ``copy_id``


class Service:
    def __init__(self, wg: str, budget_bytes: int, host_root: str, threads: int,
                 skip_onload: tuple[str, ...] = (), spill_root: str | None = None,
                 fail_at: tuple[str, ...] = (), rank: int = 0, world: int = 1):
        torch.set_num_threads(threads)
        self.wg, self.threads, self.rank, self.world = wg, threads, rank, world
        self.store = StateStore(DeviceMemory(budget_bytes), HostStore(host_root),
                                disk=DiskStore(spill_root) if spill_root else None,
                                fail_at=fail_at)
        self.skip_onload = set(skip_onload)
        self.jobs: dict[JobId, HostedJob] = {}
        self.log: list[dict] = []
        self.failed: list[dict] = []   #: transitions that raised, in order
        self._lock = threading.Lock()

    def ready(self) -> dict:
        return {"wg": self.wg, "pid": os.getpid(), "threads": torch.get_num_threads()}

    def close(self) -> None:
        self.store.host.close()
        if self.store.disk is not None:
            self.store.disk.close()

    # -- jobs ---------------------------------------------------------------------------------
    def bind(self, job: JobId, token: str, role: Role, copy: Copy, spec: ModelSpec, seed: int,
             sizes: dict[State, int], tiers: dict[State, Tier] | None = None,
             lane: int = 0) -> None:
        """Create one copy's States (of rollout ``lane``): the seeded initial weights, zero
        grads and moments, each on the tier the core put it (``tiers``; HOST where not given).

        Serialised: building a model seeds torch's global generator, which two threads must
        not do at once (the weights would depend on their interleaving)."""
        with self._lock:
            if spec.lora and self.world > 1:
                raise CallError(f"job {job}: LoRA models run on worker groups of one device "
                                f"here, {self.wg} has {self.world}; fix: bind it to a group of "
                                "one device", job=job)
            hosted = self.jobs.setdefault(job, HostedJob(token))
            if role not in hosted.models:
                engine = LoraEngine(spec, _seed_of(seed, role)) if spec.lora else \
                    Engine(spec, seed=_seed_of(seed, role)) if self.world == 1 else \
                    ShardedEngine(spec, _seed_of(seed, role), rank=self.rank, world=self.world)
                hosted.models[role] = HostedModel(engine, {0: torch.Generator().manual_seed(seed)},
                                                  engine.initial_weights())
            model = hosted.models[role]
            model.generators.setdefault(lane, torch.Generator().manual_seed(seed))
            self._create(job, role, copy, model, sizes, tiers or {}, lane)
            model.bound.add((copy, lane))
            if model.bound == {(c, 0) for c in copies_of(role, spec)}:
                model.initial_weights = None

    def _create(self, job: JobId, role: Role, copy: Copy, model: "HostedModel",
                sizes: dict[State, int], tiers: dict[State, Tier], lane: int) -> None:
        engine = model.engine
        shapes = {State.WEIGHTS: engine.numel, State.GRADS: engine.numel,
                  State.OPTIMIZER: engine.optimizer_numel,
                  State.BASE: getattr(engine, "base_numel", 0)}
        for state, num_bytes in sizes.items():
            if state == State.KV_CACHE:
                continue   # reserved per call (workspace), never a standing buffer
            if num_bytes != 4 * shapes[state] * self.world:   # the core counts all ranks
                raise CallError(f"job {job}: the core counts {num_bytes} bytes for {state} of "
                                f"{role}/{copy} on {self.world} device(s), the engine's shards "
                                f"hold {4 * shapes[state] * self.world}; the ModelSpec does not "
                                "describe this model: build it with "
                                "plexrl.runtime.models.model_spec", job=job)
            if state == State.BASE:   # the group's, made by the first job on it
                name = _name(base_key(engine.spec.base, self.wg))
                if name not in self.store.keys():
                    self.store.create(name, engine.initial_base(), tier=tiers.get(state, Tier.HOST))
                continue
            init = model.initial_weights if state == State.WEIGHTS else 4 * shapes[state]
            self.store.create(_name(StateKey(job, role, copy, state, lane)), init,
                              tier=tiers.get(state, Tier.HOST))

    def holdings(self) -> dict:
        """Per job: its token, each State's (tier, version) keyed "role/copy/state", and the
        next call on each model copy ("role/copy"); read by a restarted controller."""
        held = {}
        for job, hosted in self.jobs.items():
            keys = set(self.store.keys())
            states = {}
            for role, model in hosted.models.items():
                for copy, lane in model.bound:
                    version = model.rollout_versions.get(lane, 0) if copy == Copy.ROLLOUT \
                        else model.optim_steps
                    for state in State:
                        name = _name(StateKey(job, role, copy, state, lane))
                        if name in keys:
                            states[f"{role}/{copy_label(copy, lane)}/{state}"] = (
                                str(self.store.where(name)), version)
            held[job] = {"token": hosted.token, "states": states,
                         "next_seq": next_seq_labels(hosted.next_seq)}
        return held

    def checkpoint(self, job: JobId, role: Role, path: str) -> dict:
        """Write the job's trainer copy to ``path`` as SAVE does (a DISK checkpoint)."""
        hosted = self.jobs[job]
        request = CallRequest(job, hosted.token, -1, Function.SAVE, Role(role),
                              options=(("path", path),))
        return self._save(request, hosted.models[Role(role)], None)

    def whole_weights(self, job: JobId, role: Role) -> np.ndarray | None:
        """The trainer copy's whole weights, wherever they are (rank 0 of a group of several
        devices gathers them; the other ranks answer None). Runs on the copy thread."""
        hosted = self.jobs.get(job)
        if hosted is None or Role(role) not in hosted.models:
            raise CallError(f"worker group {self.wg}: job {job} has no {role} trainer copy here",
                            job=job)
        held = np.array(self.store.read(_name(StateKey(job, Role(role), Copy.TRAINER,
                                                       State.WEIGHTS))))
        if self.world == 1:
            return held
        whole = hosted.models[Role(role)].engine.gather_state(torch.from_numpy(held),
                                                              on_copy_thread=True)
        return None if whole is None else whole.numpy()

    def unbind(self, job: JobId) -> None:
        """Forget the job and its States; a LoRA base no job here uses any more goes too."""
        with self._lock:
            hosted = self.jobs.pop(job, None)
            bases = {m.engine.spec.base for m in (hosted.models.values() if hosted else ())
                     if m.engine.spec.lora}
            used = {m.engine.spec.base for h in self.jobs.values() for m in h.models.values()
                    if m.engine.spec.lora}
        self.store.forget(job)
        for base in bases - used:
            self.store.forget(_name(base_key(base, self.wg)))

    # -- transitions --------------------------------------------------------------------------
    def move(self, key: StateKey, src: Tier, dst: Tier, reason: str) -> dict:
        """Copy a State into storage of the other tier; logs both buffers' addresses."""
        name = _name(key)
        before = self.store.location(name)
        started = time.monotonic()
        try:
            moved = self.store.move(name, dst)
        except Exception as err:   # the previous copy stays current; the controller replans
            self.failed.append({"key": str(key), "src": str(src), "dst": str(dst),
                                "error": type(err).__name__})
            raise
        if key.copy == Copy.ROLLOUT and key.state == State.WEIGHTS and dst == Tier.HOST \
                and key.lane == 0:
            self._save_generator(key.job)   # the sampling generator travels with its copy
        if dst == Tier.DEVICE and str(key.state) in self.skip_onload:
            self.store.tensor(name).zero_()   # fault injection: as if the bytes never came back
        self.log.append({"key": str(key), "job": key.job, "wg": self.wg,
                         "state": f"{key.copy}/{key.state}",
                         "src": str(src), "dst": str(dst), "reason": reason,
                         "num_bytes": moved.num_bytes, "start_s": started,
                         "end_s": time.monotonic(),
                         "seconds": moved.seconds, "src_ptr": before,
                         "dst_ptr": self.store.location(name), "checksum": moved.checksum})
        return {"seconds": moved.seconds, "num_bytes": moved.num_bytes}

    def _save_generator(self, job: JobId) -> None:
        hosted = self.jobs.get(job)
        if hosted is not None and Role.POLICY in hosted.models:
            self.store.save_rng(job, hosted.models[Role.POLICY].generator)

    def transitions(self, failed: bool = False, start: int = 0) -> list[dict]:
        """Every transition done (or, ``failed``, every one that raised), from the
        ``start``-th on (metrics read only the new ones)."""
        return (self.failed if failed else self.log)[start:]

    def stats(self) -> dict:
        """Bytes held per tier (every copy counted), States, and this process's resident memory."""
        stats = self.store.stats()
        return {"device_bytes": stats.device.used_bytes, "reserved_bytes": stats.device.reserved_bytes,
                "host_bytes": stats.host_used_bytes, "disk_bytes": stats.disk_used_bytes,
                "disk_files": stats.disk_num_files, "num_states": stats.num_states,
                "num_copies": stats.num_copies, "jobs": sorted(self.jobs),
                "rss_bytes": psutil.Process().memory_info().rss}

    # -- calls --------------------------------------------------------------------------------
    def run(self, order: CallOrder, payload) -> object:
        """Run one dispatched call on its States; a bad argument is a ``CallError``."""
        request = order.request
        hosted = self._authorised(order)
        model = hosted.models[request.role]
        reserve = f"call-{order.call}"
        # the controller reserves for the whole group; each rank holds its share
        self.store.device.reserve(reserve, -(-order.workspace_bytes // self.world))
        try:
            with self._base(request, model):
                return _RUNNERS[request.function](self, request, model, payload or {})
        except (ValueError, KeyError, TypeError, IndexError, RuntimeError) as err:
            if isinstance(err, PlexError):
                raise
            raise CallError(f"job {request.job} call {request.seq} ({request.function}) failed "
                            f"on its arguments: {type(err).__name__}: {err}", job=request.job,
                            seq=request.seq, function=str(request.function)) from None
        finally:
            self.store.device.release_reserve(reserve)

    def check_token(self, request: CallRequest) -> HostedJob:
        """The call's job, if the call carries that job's token."""
        return hosted_job(self.jobs, self.wg, request)

    def _authorised(self, order: CallOrder) -> HostedJob:
        """The call's job, if the call carries its token and is next on its model copy."""
        hosted = self.check_token(order.request)
        take_turn(hosted, order)
        return hosted

    @contextmanager
    def _base(self, request: CallRequest, model: HostedModel):
        """A LoRA model's forward runs on the group's base, pinned on DEVICE meanwhile."""
        if not (model.engine.spec.lora and request.function in FORWARD):
            yield
            return
        with self.store.use(_name(base_key(model.engine.spec.base, self.wg))) as (base,), \
                model.engine.on_base(base):
            yield

    def _use(self, request: CallRequest, copy: Copy, *states: State):
        """Pin the call's States on DEVICE for its duration (a move of them now is a bug)."""
        lane = request.lane if copy == Copy.ROLLOUT else 0
        return self.store.use(*(_name(StateKey(request.job, request.role, copy, s, lane))
                                for s in states))

    def _generate(self, request: CallRequest, model: HostedModel, payload) -> dict:
        """Sample the prompts; a lane's call (option ``rows``: [start, stop)) samples only
        those rows, with the noise and padding of the whole batch (engine.py)."""
        prompts = [list(map(int, p)) for p in _field(request, payload, "prompts")]
        start, stop = request.option("rows", (0, len(prompts)))
        if not 0 <= start <= stop <= len(prompts):
            raise CallError(f"job {request.job} call {request.seq}: rows [{start}, {stop}) are "
                            f"not within the {len(prompts)} prompts; fix: leave rows to the "
                            "client", job=request.job, seq=request.seq, function="generate")
        with self._use(request, Copy.ROLLOUT, State.WEIGHTS) as (weights,):
            out = model.engine.generate(
                weights, prompts, max_tokens=request.max_tokens,
                temperature=float(request.option("temperature", 1.0)),
                top_p=float(request.option("top_p", 1.0)), stop=list(request.option("stop", ())),
                generator=model.generators[request.lane], rows=slice(start, stop))
        return {**out, "version": model.rollout_versions.get(request.lane, 0)}

    def _logprobs(self, request: CallRequest, model: HostedModel, payload) -> dict:
        """Per-token logprobs (values, for a value head); with option ``loss``, that loss
        and its metrics too, no gradient taken (Tinker's ``forward``)."""
        ids = _field(request, payload, "input_ids")
        mask = payload.get("attention_mask")
        options = dict(request.options)
        with self._use(request, Copy.TRAINER, State.WEIGHTS) as (weights,):
            if "loss" in options:
                return model.engine.forward_loss(weights, payload, options.pop("loss"), **options)
            if model.engine.spec.head == "value":
                return {"values": model.engine.values(weights, ids, mask)}
            return {"logprobs": model.engine.logprobs(
                weights, ids, mask, temperature=float(request.option("temperature", 1.0)),
                target_tokens=payload.get("target_tokens"))}

    def _forward_backward(self, request: CallRequest, model: HostedModel, payload) -> dict:
        options = dict(request.options)
        loss = options.pop("loss")
        _field(request, payload, "input_ids")
        with self._use(request, Copy.TRAINER, State.WEIGHTS, State.GRADS) as (weights, grads):
            return model.engine.forward_backward(weights, grads, payload, loss, **options)

    def _optim_step(self, request: CallRequest, model: HostedModel, payload) -> dict:
        with self._use(request, Copy.TRAINER, State.WEIGHTS, State.GRADS,
                       State.OPTIMIZER) as (weights, grads, optimizer):
            out = model.engine.optim_step(weights, grads, optimizer, **dict(request.options))
        model.optim_steps += 1
        return {**out, "version": model.optim_steps}

    def _sync_weights(self, request: CallRequest, model: HostedModel, payload) -> dict:
        """The rollout copy takes the trainer's weights: from this service, or the whole
        weights of a trainer copy on another group (``trainer_weights``), of which each rank
        takes its share."""
        if "trainer_weights" in payload:
            whole = torch.from_numpy(np.asarray(payload["trainer_weights"]))
            trainer = (whole if self.world == 1 else model.engine.take_state(whole)).numpy()
        else:
            trainer = self.store.read(_name(StateKey(request.job, request.role, Copy.TRAINER,
                                                     State.WEIGHTS)))
        with self._use(request, Copy.ROLLOUT, State.WEIGHTS) as (weights,):
            np.copyto(weights.numpy(), trainer)
        model.rollout_versions[request.lane] = request.version
        return {"version": request.version}

    def _save(self, request: CallRequest, model: HostedModel, payload) -> dict:
        path = str(request.option("path"))
        tensors = {}
        for state in self._trainer_states(request):
            held = torch.from_numpy(np.array(self.store.read(
                _name(StateKey(request.job, request.role, Copy.TRAINER, state)))))
            tensors[str(state)] = held if self.world == 1 else \
                model.engine.gather_state(held, optimizer=state == State.OPTIMIZER)
        if self.rank == 0:   # rank 0 writes the whole States
            tensors["generator"] = model.generator.get_state()
            save_file(tensors, path, metadata={"optim_steps": str(model.optim_steps),
                                               "rollout_version": str(
                                                   model.rollout_versions.get(0, 0))})
        return {"path": path, "optim_steps": model.optim_steps}

    def _load(self, request: CallRequest, model: HostedModel, payload) -> dict:
        path = str(request.option("path"))
        try:
            tensors = load_file(path)
        except (OSError, ValueError) as err:
            raise CallError(f"job {request.job}: cannot load {path}: {err}; fix: pass a file "
                            "SAVE wrote", job=request.job, seq=request.seq,
                            function="load") from None
        states = self._trainer_states(request)
        weights_only = not request.option("optimizer", True)   # a fresh optimizer, no grads
        with self._use(request, Copy.TRAINER, *states) as buffers:
            for state, buffer in zip(states, buffers):
                if weights_only and state != State.WEIGHTS:
                    buffer.zero_()
                    continue
                whole = tensors[str(state)]
                buffer.copy_(whole if self.world == 1 else
                             model.engine.take_state(whole, optimizer=state == State.OPTIMIZER))
        if not weights_only:
            model.generator.set_state(tensors["generator"])
        if request.version:   # a resumed job names the version it restores
            model.optim_steps = request.version
        return {"path": path}

    def _trainer_states(self, request: CallRequest) -> tuple[State, ...]:
        keys = set(self.store.keys())
        return tuple(s for s in (State.WEIGHTS, State.GRADS, State.OPTIMIZER)
                     if _name(StateKey(request.job, request.role, Copy.TRAINER, s)) in keys)


_RUNNERS = {Function.GENERATE: Service._generate, Function.LOGPROBS: Service._logprobs,
            Function.FORWARD_BACKWARD: Service._forward_backward,
            Function.OPTIM_STEP: Service._optim_step, Function.SYNC_WEIGHTS: Service._sync_weights,
            Function.SAVE: Service._save, Function.LOAD: Service._load}


def _name(key: StateKey) -> str:
    return str(key)


def _seed_of(seed: int, role: Role) -> int:
    """A per-model seed: the job's seed and the role, stable across processes (no ``hash``)."""
    return seed * 1009 + sum(map(ord, str(role)))


def _field(request: CallRequest, payload, name: str):
    if not isinstance(payload, dict) or name not in payload:
        raise CallError(f"job {request.job} call {request.seq} ({request.function}): the payload "
                        f"has no {name!r}", job=request.job, seq=request.seq,
                        function=str(request.function))
    return payload[name]
