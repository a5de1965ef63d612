"""The vocabulary of PlexRL: typed ids, enums, and the frozen messages that cross layers.

Owns: the words of ../shared/DESIGN.md section 2 (Function, State, Tier, Copy, Role), the
typed ids, ``ModelSpec`` (what a job declares about a model), ``StateKey`` and the table
of which States a Function needs resident. Stdlib only; knows nothing of scheduling,
simulation, Ray or torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import NewType

JobId = NewType("JobId", str)
CallId = NewType("CallId", int)
WorkerGroupId = NewType("WorkerGroupId", str)
NodeId = NewType("NodeId", str)


class Function(enum.StrEnum):
    """A kind of remote operation a job calls on a service."""

    GENERATE = "generate"
    LOGPROBS = "logprobs"
    FORWARD_BACKWARD = "forward_backward"
    OPTIM_STEP = "optim_step"
    SYNC_WEIGHTS = "sync_weights"
    SAVE = "save"
    LOAD = "load"


class State(enum.StrEnum):
    """A piece of a job's model state."""

    WEIGHTS = "weights"
    GRADS = "grads"
    OPTIMIZER = "optimizer"
    KV_CACHE = "kv_cache"
    #: a LoRA model's frozen base weights: one per worker group and base, owned by no job and
    #: shared by every LoRA job bound there on that base (``base_key``; docs/design.md, D215)
    BASE = "base"


class Tier(enum.StrEnum):
    """Where a State lives. DROPPED: no bytes kept; rebuilt, not copied (KV cache)."""

    DEVICE = "device"
    HOST = "host"
    DISK = "disk"
    DROPPED = "dropped"


class Role(enum.StrEnum):
    """The role a model plays in a job."""

    POLICY = "policy"
    REFERENCE = "reference"
    REWARD = "reward"
    VALUE = "value"


class Copy(enum.StrEnum):
    """Which copy of a model: the trainer copy (trained, scored) or the rollout copy (samples)."""

    TRAINER = "trainer"
    ROLLOUT = "rollout"


#: Which copy a Function runs on.
COPY_OF: dict[Function, Copy] = {
    Function.GENERATE: Copy.ROLLOUT,
    Function.SYNC_WEIGHTS: Copy.ROLLOUT,
    Function.LOGPROBS: Copy.TRAINER,
    Function.FORWARD_BACKWARD: Copy.TRAINER,
    Function.OPTIM_STEP: Copy.TRAINER,
    Function.SAVE: Copy.TRAINER,
    Function.LOAD: Copy.TRAINER,
}

_TRAIN_STATES = (State.WEIGHTS, State.GRADS, State.OPTIMIZER)

#: The States a Function needs on DEVICE (DESIGN.md section 5).
NEEDS: dict[Function, tuple[State, ...]] = {
    Function.GENERATE: (State.WEIGHTS, State.KV_CACHE),
    Function.SYNC_WEIGHTS: (State.WEIGHTS,),
    Function.LOGPROBS: (State.WEIGHTS,),
    Function.FORWARD_BACKWARD: _TRAIN_STATES,
    Function.OPTIM_STEP: _TRAIN_STATES,
    Function.SAVE: (State.WEIGHTS,),
    Function.LOAD: _TRAIN_STATES,     # restores weights and optimizer state in place
}

#: The Functions that run a model forward: a LoRA model's needs its base resident too.
FORWARD: frozenset[Function] = frozenset({Function.GENERATE, Function.LOGPROBS,
                                          Function.FORWARD_BACKWARD})

BASE_OWNER = "base:"             #: the ``job`` of a base's StateKey starts so; no job id may

#: The States each copy of a trained model holds; a frozen model (reference, reward)
#: holds only weights on its trainer copy.
STATES_OF: dict[Copy, tuple[State, ...]] = {
    Copy.TRAINER: _TRAIN_STATES,
    Copy.ROLLOUT: (State.WEIGHTS, State.KV_CACHE),
}


@dataclass(frozen=True, order=True)
class StateKey:
    """Names one State of one copy of one job's model."""

    job: JobId
    role: Role
    copy: Copy
    state: State
    lane: int = 0                #: which rollout lane of the copy (0: the copy itself)

    def __str__(self) -> str:
        lane = f"#{self.lane}" if self.lane else ""
        return f"{self.job}/{self.role}/{self.copy}{lane}/{self.state}"


def base_key(base: str, wg: WorkerGroupId) -> StateKey:
    """The State of the frozen base ``base`` on worker group ``wg`` (D215)."""
    return StateKey(JobId(f"{BASE_OWNER}{base}@{wg}"), Role.POLICY, Copy.TRAINER, State.BASE)


def copy_id(role: Role, copy: Copy, lane: int = 0) -> tuple:
    """How bindings and call order name one copy: ``(role, copy)``; a rollout lane other than
    the first adds its number, ``(role, copy, lane)`` (docs/design.md, D202)."""
    return (role, copy) if lane == 0 else (role, copy, lane)


def shares(num: int, parts: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each of ``parts`` contiguous near-equal shares of ``num`` rows,
    the first ``num % parts`` one longer (rollout lanes, simulated rollout instances)."""
    base, extra = divmod(num, parts)
    out, start = [], 0
    for part in range(parts):
        stop = start + base + (part < extra)
        out.append((start, stop))
        start = stop
    return out


def split_copy_id(key: tuple) -> tuple[Role, Copy, int]:
    """``(role, copy, lane)`` of a ``copy_id`` key."""
    return (key[0], key[1], key[2] if len(key) > 2 else 0)


def copy_label(copy: Copy, lane: int = 0) -> str:
    """A copy as text (journal rows, service holdings): ``rollout``, or ``rollout#1`` for
    lane 1."""
    return f"{copy}#{lane}" if lane else str(copy)


def parse_copy_label(label: str) -> tuple[Copy, int]:
    """The ``(copy, lane)`` that ``copy_label`` wrote."""
    copy, _, lane = label.partition("#")
    return Copy(copy), int(lane or 0)


@dataclass(frozen=True)
class ModelSpec:
    """What a job declares about a model; every size derives from it.

    Parallelism is that of the trainer copy (``tp * pp * dp`` devices, experts split
    ``ep`` ways inside it); the rollout copy runs instances of ``rollout_tp`` devices.
    """

    name: str
    total_params: float          #: parameters, all experts included
    active_params: float         #: parameters touched per token (MoE: routed experts only)
    num_layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int = 2         #: bytes per weight element (bf16 = 2)
    tp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    rollout_tp: int = 1
    optimizer: str = "adamw"     #: "adamw" (fp32 master + two moments) or "adamw-offload"
    trainable: bool = True
    head: str = "lm"             #: "lm" (next-token logits) or "value" (one scalar per token)
    source: str = ""             #: runtime: a built-in tiny config name or a local checkpoint dir
    kv_cache_tokens: int | None = None  #: None: the KV cache fills the rollout group's free
    #: memory (inference engines pre-allocate it); else tokens of KV cache per instance
    vocab_size: int = 0          #: sizes the logits in a call's activation estimate
    sharded: bool = False        #: FSDP / ZeRO-3: one replica whose States are split in equal
    #: (padded) shards over every device of the group it is bound to, rollout copy included
    #: LoRA (D215): adapters of this rank on a frozen base named ``base`` of ``base_params``
    #: parameters. ``total_params`` are then the adapters' (what WEIGHTS, GRADS and
    #: OPTIMIZER hold), ``active_params`` the base's per token (what a forward computes).
    lora_rank: int = 0
    base: str = ""
    base_params: float = 0.0
    lora_targets: tuple[str, ...] = ()   #: runtime: the parts adapted (models.LORA_PARTS)

    def __post_init__(self):
        if self.head not in ("lm", "value"):
            raise ValueError(f"model {self.name}: head must be 'lm' or 'value', got {self.head!r}")
        if self.lora_rank and (not self.base or self.base_params <= 0):
            raise ValueError(f"model {self.name}: a LoRA model (lora_rank {self.lora_rank}) "
                             "names its base and the base's parameter count (base, base_params)")

    @property
    def lora(self) -> bool:
        return self.lora_rank > 0

    @property
    def train_devices(self) -> int:
        """Devices of one trainer copy at its declared parallelism."""
        return self.tp * self.pp * self.dp

    @property
    def replica_devices(self) -> int:
        """Devices of one model replica of the trainer (one data-parallel rank)."""
        return self.tp * self.pp

    def activation_bytes(self, num_tokens: int, training: bool = False) -> int:
        """A rough device workspace for ``num_tokens`` tokens in flight: fp32 logits plus a
        few hidden-sized buffers per layer; training keeps them for backward (x3)."""
        per_token = 4 * (self.vocab_size + 8 * self.num_layers * self.kv_heads * self.head_dim)
        return num_tokens * per_token * (3 if training else 1)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes per token of context, whole model (K and V, all layers)."""
        return 2 * self.num_layers * self.kv_heads * self.head_dim * self.dtype_bytes


# -- wire messages between a job's client and a runtime (docs/design.md, "The client") --------

@dataclass(frozen=True)
class JobRequest:
    """A job's registration: its models, by role, and how it samples."""

    job: JobId
    models: tuple[tuple[Role, ModelSpec], ...]
    staleness: int = 0           #: GENERATE of step k samples weight version max(0, k - staleness)
    seed: int = 0                #: seeds the job's weights and its sampling generator
    priority: int = 0            #: higher is admitted first
    save_interval: int = 0       #: the runtime checkpoints the trainer every N versions (0: never)
    #: the policy's rollout copy as this many lanes, each bound to a worker group of its own
    #: choosing; a GENERATE is split over them by rows (docs/design.md, D206)
    rollout_lanes: int = 1
    #: how a GENERATE is split over the lanes: "rows" (each lane its share of the rows) or
    #: "calls" (all rows to one lane in turn; the others only keep their sampling streams in
    #: step) (D206)
    rollout_split: str = "rows"


@dataclass(frozen=True)
class Ticket:
    """What registration hands back: the job's id and its secret token."""

    job: JobId
    token: str                   #: proves the caller owns the job; checked where state is touched


@dataclass(frozen=True)
class CallRequest:
    """One call of a job, as its client sends it. ``payload`` (the bulk arguments) goes to the
    service that runs the call; a transport never hands it to the controller."""

    job: JobId
    token: str
    seq: int                     #: the job's call order, from 0; runtimes run calls in this order
    function: Function
    role: Role
    step: int = 0                #: the job's training step
    version: int = 0             #: GENERATE: version to sample from; SYNC_WEIGHTS: to install
    options: tuple[tuple[str, object], ...] = ()  #: scalar arguments (temperature, loss, lr...)
    num_sequences: int = 0       #: sequences in the payload (sizes the call's workspace)
    seq_len: int = 0             #: longest input sequence, tokens
    max_tokens: int = 0          #: GENERATE: new tokens per sequence at most
    payload: object = None       #: the bulk arguments (token ids, batches): opaque here
    lane: int = 0                #: GENERATE, SYNC_WEIGHTS: the rollout lane it runs on (D206)

    @property
    def copy(self) -> Copy:
        return COPY_OF[self.function]

    @property
    def copy_id(self) -> tuple:
        """The key of the copy it runs on (``copy_id``): where it is bound, whose order it takes."""
        return copy_id(self.role, self.copy, self.lane)

    def option(self, name: str, default: object = None) -> object:
        return dict(self.options).get(name, default)
