"""What the controller keeps per job and per call, and how a request becomes core input.

Owns: ``job_spec`` (a ``JobRequest`` as the core's ``JobSpec``: which copies each model has,
on which worker groups), ``workspace_bytes`` (the device reserve a call makes at dispatch:
KV cache for batch x (prompt + max tokens) plus an activation estimate, both from the
ModelSpec), ``check_request`` (a malformed call's named error), and the records
``JobRecord`` / ``PendingCall``. Must not know: Ray, torch, how calls run.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field

from plexrl.core.jobs import JobSpec, ModelDecl
from plexrl.errors import CallError, ConfigError
from plexrl.protocol import (CallId, CallRequest, Copy, Function, JobRequest, ModelSpec,
                             Role, WorkerGroupId)
from plexrl.runtime.workers.order import copies_of


def job_spec(request: JobRequest, groups: tuple[WorkerGroupId, ...]) -> JobSpec:
    """The core's view of a job. Every copy may go on any group; placement ranks groups the
    same way for every copy of a model, so a policy's two copies land together (SYNC_WEIGHTS
    is a local copy; the controller checks it)."""
    check_models(request)
    check_lanes(request, len(groups))
    models = tuple(ModelDecl(role, spec, copies_of(role, spec)) for role, spec in request.models)
    candidates = tuple((decl.role, copy, groups) for decl in models for copy in decl.copies)
    return JobSpec(job=request.job, models=models, candidates=candidates,
                   staleness=request.staleness, priority=request.priority,
                   rollout_lanes=request.rollout_lanes)


def check_lanes(request: JobRequest, num_groups: int) -> None:
    """Rollout lanes need a trained policy, and one worker group each at most."""
    lanes = request.rollout_lanes
    if not isinstance(lanes, int) or lanes < 1:
        raise ConfigError("rollout_lanes must be a whole number >= 1",
                          field=f"{request.job}.rollout_lanes", value=lanes,
                          fix="1 (one rollout copy), or how many worker groups share its rollouts")
    if request.rollout_split not in ("rows", "calls"):
        raise ConfigError("rollout_split is rows or calls", field=f"{request.job}.rollout_split",
                          value=request.rollout_split,
                          fix="rows: each lane samples its share of a GENERATE's rows; calls: "
                              "each GENERATE goes whole to one lane in turn")
    if lanes == 1:
        return
    policy = dict(request.models).get(Role.POLICY)
    if policy is None or Copy.ROLLOUT not in copies_of(Role.POLICY, policy):
        raise ConfigError("rollout lanes split a trained policy's rollout copy; this job has none",
                          field=f"{request.job}.rollout_lanes", value=lanes,
                          fix="register a trainable policy, or rollout_lanes=1")
    if lanes > num_groups:
        raise ConfigError(f"{lanes} rollout lanes but {num_groups} worker groups",
                          field=f"{request.job}.rollout_lanes", value=lanes,
                          fix=f"at most {num_groups} lanes, or configure more worker groups")


def check_models(request: JobRequest) -> None:
    roles = [role for role, _ in request.models]
    if not roles:
        raise ConfigError("a job needs at least one model", field=f"{request.job}.models",
                          fix="register it with models={'policy': model_spec(...)}")
    if len(set(roles)) != len(roles):
        raise ConfigError("each role names one model", field=f"{request.job}.models",
                          value=roles, fix="give each model its own role")
    for role, spec in request.models:
        if not spec.source:
            raise ConfigError("the runtime needs a model source", field=f"{request.job}.{role}",
                              value=spec.name, fix="build the spec with plexrl.runtime.models."
                              "model_spec(name, source=...)")


def workspace_bytes(spec: ModelSpec, request: CallRequest, devices: int = 1) -> int:
    """Device bytes a call reserves while it runs, on a worker group of ``devices`` (all its
    devices together): activations, KV cache, and for a model sharded over several devices
    the whole weights every rank gathers for the call."""
    n, length = request.num_sequences, request.seq_len
    gathered = 0
    if spec.sharded and devices > 1 and request.function in (
            Function.GENERATE, Function.LOGPROBS, Function.FORWARD_BACKWARD):
        gathered = devices * spec.dtype_bytes * math.ceil(spec.total_params / devices) * devices
    if request.function == Function.GENERATE:
        tokens = n * (length + request.max_tokens)
        return spec.kv_bytes_per_token * tokens + spec.activation_bytes(tokens) + gathered
    if request.function == Function.LOGPROBS:
        return spec.activation_bytes(n * length) + gathered
    if request.function == Function.FORWARD_BACKWARD:
        return spec.activation_bytes(n * length, training=True) + gathered
    return 0


def check_request(request: CallRequest, job: "JobRecord") -> None:
    """A call the job's models cannot take is a ``CallError`` before it is queued."""
    def fail(why: str, fix: str) -> None:
        raise CallError(f"job {request.job} call {request.seq} ({request.function}): {why}; "
                        f"fix: {fix}", job=request.job, seq=request.seq,
                        function=str(request.function))
    specs = dict(job.request.models)
    if request.role not in specs:
        fail(f"the job has no {request.role} model", f"use one of {sorted(specs)}")
    if request.copy not in copies_of(request.role, specs[request.role]):
        fail(f"its {request.role} model has no {request.copy} copy",
             "generate and sync only on a trained policy")
    lanes = job.request.rollout_lanes if request.copy == Copy.ROLLOUT else 1
    if not 0 <= request.lane < lanes:
        fail(f"lane {request.lane} of its {request.role}/{request.copy} copy does not exist "
             f"(it has {lanes})", "leave lane to the client, which splits a GENERATE over lanes")
    if request.function == Function.GENERATE and (request.num_sequences < 1
                                                  or request.max_tokens < 1):
        fail("GENERATE needs at least one prompt and max_tokens >= 1",
             "pass a non-empty list of token-id lists and max_tokens > 0")
    if request.function in (Function.LOGPROBS, Function.FORWARD_BACKWARD) and \
            request.num_sequences < 1:
        fail("the batch has no input_ids", "pass a dict with an input_ids array (B, T)")


@dataclass
class PendingCall:
    """A call from its arrival at the controller until it ran (its payload is not here)."""

    request: CallRequest
    error: CallError | None = None           #: malformed: it only takes its place in the order
    call: CallId | None = None
    wg: WorkerGroupId | None = None
    workspace_bytes: int = 0
    copy_seq: int = 0
    queued_at: float = 0.0
    started_at: float = 0.0
    #: resolves to the end time once its finish is folded (or it is given up)
    folded: asyncio.Future | None = None
    after: asyncio.Future | None = None      #: the ``folded`` of the call it was sent behind


@dataclass
class JobRecord:
    request: JobRequest
    token: str
    placed: asyncio.Future                   #: the ticket, once every copy is bound
    renewed_at: float = 0.0                  #: the driver's last sign of life (monotonic s)
    handed: bool = False                     #: its driver has used its ticket
    next_seq: int = 0                        #: the client sequence number admitted next
    held: dict[int, PendingCall] = field(default_factory=dict)   #: arrived early
    copy_seq: dict[tuple, int] = field(default_factory=dict)   #: per ``copy_id``
    groups: dict[tuple, WorkerGroupId] = field(default_factory=dict)   #: ``copy_id`` -> group
    #: (role, lane) -> the newest version a queued sync installs in that rollout lane
    synced: dict[tuple[Role, int], int] = field(default_factory=dict)
    parked: list[PendingCall] = field(default_factory=list)  #: GENERATEs awaiting their version

    def gate(self, pending: PendingCall) -> bool:
        """Park a GENERATE whose version no sync has been issued for (True: parked); refuse a
        GENERATE whose version an earlier sync already replaced, and a sync of a version
        already installed (neither could ever run)."""
        request = pending.request
        installed = self.synced.get((request.role, request.lane), 0)
        if request.function == Function.SYNC_WEIGHTS and request.version <= installed:
            raise CallError(
                f"job {request.job} call {request.seq}: nothing to sync, version "
                f"{request.version} is installed already (or a sync before it installs "
                f"{installed}); fix: sync after an optim_step or load", job=request.job,
                seq=request.seq, function="sync_weights")
        if request.function != Function.GENERATE:
            return False
        if request.version > installed:
            self.parked.append(pending)
            return True
        if request.version < installed:
            raise CallError(
                f"job {request.job} call {request.seq}: GENERATE of step {request.step} must "
                f"sample version {request.version}, but a SYNC_WEIGHTS issued before it installs "
                f"version {installed}; fix: issue the GENERATE before that sync",
                job=request.job, seq=request.seq, function="generate")
        return False

    def released_by(self, request: CallRequest) -> tuple[list[PendingCall],
                                                         list[tuple[PendingCall, CallError]]]:
        """The parked GENERATEs a just-queued sync lets go, in their order, and those it
        leaves behind for good (a sync skipped their version), with their error."""
        if request.function != Function.SYNC_WEIGHTS:
            return [], []
        lane = (request.role, request.lane)
        self.synced[lane] = max(self.synced.get(lane, 0), request.version)
        ready, stale, parked = [], [], []
        for pending in self.parked:
            wanted = pending.request.version
            if (pending.request.role, pending.request.lane) != lane or wanted > request.version:
                parked.append(pending)
            elif wanted == request.version:
                ready.append(pending)
            else:
                stale.append((pending, CallError(
                    f"job {request.job}: GENERATE call {pending.request.seq} waits for version "
                    f"{wanted}, but sync call {request.seq} installs version {request.version} "
                    "over it; fix: sync every version a GENERATE names", job=request.job,
                    seq=pending.request.seq, function="generate")))
        self.parked = parked
        return ready, stale

    def spec(self, role: Role) -> ModelSpec:
        return dict(self.request.models)[role]

    def next_copy_seq(self, request: CallRequest) -> int:
        key = request.copy_id
        seq = self.copy_seq.get(key, 0)
        self.copy_seq[key] = seq + 1
        return seq
