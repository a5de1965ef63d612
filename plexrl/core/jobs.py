"""The job model: what a job declares, and the bytes of each State derived from it.

Owns: ``ModelDecl`` and ``JobSpec`` (a job's models, their copies, staleness, priority, and
the worker groups each copy may be placed on), and ``state_bytes``: the size of one State
of one copy on a worker group of a given size. Must not know: tiers, time, or policies.

Byte model (Megatron distributed optimizer, bf16 weights, fp32 grads; see docs/design.md):
trainer WEIGHTS = dtype x params per data-parallel rank, GRADS = 4 x params per rank,
OPTIMIZER = 12 x params sharded across ranks (fp32 master + two moments; for fp32
weights, their own master, 8 x params and a step count); the rollout copy
holds dtype x params per instance of ``rollout_tp`` devices, and its KV cache takes the
rest of the usable memory, as inference engines pre-allocate it. A LoRA model's States
are its adapters' (``total_params``); its frozen base is one BASE State per worker group
and base, owned by no job (``base_bytes``, ``base_key``; docs/design.md, D215).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from plexrl.protocol import (COPY_OF, FORWARD, NEEDS, STATES_OF, Copy, Function, JobId, ModelSpec,
                             Role, State, StateKey, WorkerGroupId, copy_id)

GRAD_BYTES_PER_PARAM = 4
OPTIMIZER_BYTES_PER_PARAM = 12


@dataclass(frozen=True)
class ModelDecl:
    """One model of a job, in a role, with the copies it needs."""

    role: Role
    spec: ModelSpec
    copies: tuple[Copy, ...] = (Copy.TRAINER,)


@dataclass(frozen=True)
class PoolRequest:
    """A worker group a copy needs cut from free devices at admission (a cluster job's pools).

    ``pool`` names a class of shareable groups (for example a model's training pool): a later
    job asking for the same class may be bound to this group instead of cutting its own.
    ``same_as`` binds the copy to the group of another (role, copy) of the job.
    """

    role: Role
    copy: Copy
    num_devices: int = 0
    purpose: str = "any"
    pool: str = ""
    same_as: tuple[Role, Copy] | None = None


@dataclass(frozen=True)
class JobSpec:
    """What a job declares at submission.

    ``candidates`` lists, per (role, copy), the worker groups the copy may be bound to;
    placement picks one and the binding does not change while the job runs (affinity).
    """

    job: JobId
    models: tuple[ModelDecl, ...]
    candidates: tuple[tuple[Role, Copy, tuple[WorkerGroupId, ...]], ...]
    staleness: int = 0           #: GENERATE of step k uses weight version max(0, k - staleness)
    priority: int = 0            #: higher is admitted first; FCFS within a priority
    pools: tuple[PoolRequest, ...] = ()  #: copies placed on groups cut at admission
    num_steps: int = 0           #: training steps the job will run (0: unknown)
    step_s: float = 0.0          #: expected step time, declared or from history (0: unknown)
    rollout_lanes: int = 1       #: the policy's rollout copy as this many lanes, each bound to
    #: its own candidate group; GENERATE and SYNC_WEIGHTS name their lane (D202)

    @cached_property
    def placement_key(self) -> str:
        """What placement depends on (models and pool requests, not the id); equal for twins."""
        return repr((self.models, self.candidates, self.pools, self.rollout_lanes))

    @property
    def expected_s(self) -> float:
        """Expected run time, for backfilling; infinite when unknown."""
        return self.num_steps * self.step_s if self.num_steps and self.step_s else float("inf")

    def model(self, role: Role) -> ModelDecl:
        for decl in self.models:
            if decl.role == role:
                return decl
        raise KeyError(f"job {self.job} has no {role} model")

    def lanes(self, role: Role, copy: Copy) -> int:
        """How many lanes a copy has: ``rollout_lanes`` for the policy's rollout copy, else 1."""
        return self.rollout_lanes if (role, copy) == (Role.POLICY, Copy.ROLLOUT) else 1

    @property
    def copy_ids(self) -> set[tuple]:
        """Every copy placement must bind, lanes included (``copy_id`` keys)."""
        wanted = {(r, c) for r, c, _ in self.candidates} | {(q.role, q.copy) for q in self.pools}
        return {copy_id(r, c, lane) for r, c in wanted for lane in range(self.lanes(r, c))}


def states_of(decl: ModelDecl, copy: Copy) -> tuple[State, ...]:
    """The States a copy of a model holds (a frozen model's trainer copy: weights only)."""
    if copy == Copy.TRAINER and not decl.spec.trainable:
        return (State.WEIGHTS,)
    return STATES_OF[copy]


def needed_states(decl: ModelDecl, function: Function) -> tuple[State, ...]:
    """The States a call needs on DEVICE. An offloaded optimizer (ZeRO-offload) stays on HOST."""
    held = states_of(decl, COPY_OF[function])
    return tuple(s for s in NEEDS[function] if s in held and not pinned_to_host(decl, s))


def needs_base(decl: ModelDecl, function: Function) -> bool:
    """True when a call runs a LoRA model forward, so its base must be on DEVICE too."""
    return decl.spec.lora and function in FORWARD


def base_bytes(spec: ModelSpec, wg_devices: int) -> int:
    """Bytes of a LoRA model's frozen base on a worker group of ``wg_devices`` devices: one
    replica per data-parallel rank, or equal shards of one for a sharded model."""
    if spec.sharded:
        return wg_devices * int(spec.dtype_bytes * math.ceil(spec.base_params / wg_devices))
    return int(spec.dtype_bytes * spec.base_params * max(1, wg_devices // spec.replica_devices))


def pinned_to_host(decl: ModelDecl, state: State) -> bool:
    """True for a State that lives on HOST by design and is never onloaded."""
    return state == State.OPTIMIZER and decl.spec.optimizer == "adamw-offload"


def state_bytes(decl: ModelDecl, copy: Copy, state: State, wg_devices: int,
                usable_bytes_per_device: float) -> int:
    """Bytes of one State of one copy on a worker group of ``wg_devices`` devices (all its
    devices together; a sharded model's are ``wg_devices`` equal shards, so the group's total
    fits the group's budget exactly when each shard fits its device)."""
    spec = decl.spec
    params = spec.total_params
    if spec.sharded:
        return wg_devices * _shard_bytes(spec, copy, state, wg_devices)
    if copy == Copy.ROLLOUT:
        instances = max(1, wg_devices // spec.rollout_tp)
        weights = spec.dtype_bytes * params * instances
        if state == State.WEIGHTS:
            return int(weights)
        if state == State.KV_CACHE:
            if spec.kv_cache_tokens is not None:
                return spec.kv_bytes_per_token * spec.kv_cache_tokens * instances
            base = base_bytes(spec, wg_devices) if spec.lora else 0   # resident with it
            return int(max(0.0, usable_bytes_per_device * wg_devices - weights - base))
        raise ValueError(f"rollout copy holds no {state}")
    ranks = max(1, wg_devices // spec.replica_devices)
    if state == State.WEIGHTS:
        return int(spec.dtype_bytes * params * ranks)
    if state == State.GRADS:
        return int(GRAD_BYTES_PER_PARAM * params * ranks)
    if state == State.OPTIMIZER:
        if spec.dtype_bytes >= 4:   # fp32 weights are their own master: two moments, a step
            return int(2 * 4 * params) + 4
        return int(OPTIMIZER_BYTES_PER_PARAM * params)
    raise ValueError(f"trainer copy holds no {state}")


def _shard_bytes(spec, copy: Copy, state: State, wg_devices: int) -> int:
    """Bytes of one device's shard of a sharded model's State: ``ceil(params / n)`` elements
    of each flat buffer, and the optimizer's step counter on every device."""
    elements = math.ceil(spec.total_params / wg_devices)
    if state == State.WEIGHTS:
        return int(spec.dtype_bytes * elements)
    if state == State.KV_CACHE:
        return math.ceil(spec.kv_bytes_per_token * (spec.kv_cache_tokens or 0) / wg_devices)
    if copy == Copy.TRAINER and state == State.GRADS:
        return int(GRAD_BYTES_PER_PARAM * elements)
    if copy == Copy.TRAINER and state == State.OPTIMIZER:
        return int(2 * 4 * elements) + 4 if spec.dtype_bytes >= 4 else \
            int(OPTIMIZER_BYTES_PER_PARAM * elements)
    raise ValueError(f"{copy} copy holds no {state}")


def device_bytes_needed(decl: ModelDecl, copy: Copy, wg_devices: int,
                        usable_bytes_per_device: float) -> int:
    """Bytes a copy needs on DEVICE at once for its largest call (KV cache excluded; a LoRA
    model's base included)."""
    base = base_bytes(decl.spec, wg_devices) if decl.spec.lora else 0
    return base + sum(state_bytes(decl, copy, s, wg_devices, usable_bytes_per_device)
                      for s in states_of(decl, copy)
                      if s != State.KV_CACHE and not pinned_to_host(decl, s))


def keys_of(job: JobId, decl: ModelDecl, copy: Copy, lane: int = 0) -> tuple[StateKey, ...]:
    return tuple(StateKey(job, decl.role, copy, s, lane) for s in states_of(decl, copy))
