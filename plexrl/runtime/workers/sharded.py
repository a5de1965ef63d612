"""One rank's part of a model sharded over the ranks of a worker group (ZeRO-3 on flat buffers).

Owns: the ``Shard`` of the flat buffers a rank holds, and ``ShardedEngine``, which runs the
rank's part of every call over ``torch.distributed`` (gloo, see ``join_group``):

- each rank holds a contiguous 1/n of the flat weights, gradients and optimizer moments
  (``[exp_avg shard | exp_avg_sq shard | step]``), zero-padded to an equal length;
- a call that reads the weights all-gathers them into a workspace reused across calls;
- GENERATE, LOGPROBS and FORWARD_BACKWARD split their batch by rows, rank r taking the r-th
  contiguous share (data parallel); a rank with no rows still joins every collective;
- FORWARD_BACKWARD normalises by the whole batch's token count and reduces each parameter's
  gradient as backward produces it (a post-accumulate hook: all-reduce, keep this rank's
  slice, free the rest), so no rank ever holds the whole gradient;
- OPTIM_STEP is AdamW on the shards (elementwise, so the arithmetic of one device), with the
  gradient norm all-reduced from the shards' squared sums.

Why not FSDP2's ``fully_shard``: it owns its parameters as DTensors, while the ``StateStore``
owns every State as a flat buffer that moves between tiers between calls; the engine binds
views of those buffers per call (docs/design.md, "Worker groups of many devices").
Must not know: the StateStore, tiers, jobs, or how the ranks were started; the process group
is set up before the first call (``actor.ServiceActor.join``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

from plexrl.protocol import ModelSpec
from plexrl.runtime.workers.engine import Engine, _adamw, _check_flat


@dataclass(frozen=True)
class Shard:
    """The contiguous share ``[lo, hi)`` of ``numel`` flat elements that ``rank`` of ``world``
    holds; every rank's buffer has ``size`` elements (the last one zero-padded)."""

    rank: int
    world: int
    numel: int

    @property
    def size(self) -> int:
        return math.ceil(self.numel / self.world)

    @property
    def lo(self) -> int:
        return min(self.rank * self.size, self.numel)

    @property
    def hi(self) -> int:
        return min(self.lo + self.size, self.numel)

    def rows(self, batch: int) -> slice:
        """This rank's contiguous share of ``batch`` rows (the first ranks take one more)."""
        base, extra = divmod(batch, self.world)
        lo = self.rank * base + min(self.rank, extra)
        return slice(lo, lo + base + (self.rank < extra))

    def take(self, full: torch.Tensor) -> torch.Tensor:
        """This rank's padded share of a flat tensor of ``numel`` elements."""
        out = torch.zeros(self.size, dtype=full.dtype)
        out[:self.hi - self.lo] = full[self.lo:self.hi]
        return out


JOIN_TIMEOUT_S = 60.0   #: how long a collective waits for a rank before it fails


def join_group(address: str, rank: int, world: int) -> str:
    """Join this process to its worker group's process group at ``address`` (``tcp://ip:port``
    of rank 0). Gloo: the engine's tensors live in host memory (the DEVICE tier is a budget
    over them), and NCCL takes CUDA tensors only. Returns the backend."""
    global _COPY_GROUP
    backend = "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method=address, rank=rank, world_size=world,
                                timeout=timedelta(seconds=JOIN_TIMEOUT_S))
        _COPY_GROUP = dist.new_group(backend=backend, timeout=timedelta(seconds=JOIN_TIMEOUT_S))
    return backend


#: a second process group over the same ranks, for the collectives of the copy thread
#: (``gather_state(..., on_copy_thread=True)``): a group's collectives must come in one order
#: on every rank, and the compute thread's and the copy thread's interleave differently
_COPY_GROUP = None


_GATHERED: dict[int, torch.Tensor] = {}   #: the all-gather workspace of each padded length


def _gather_into(shard: torch.Tensor, world: int) -> torch.Tensor:
    """All ranks' shards end to end, in a workspace reused by every call of that length (a
    fresh buffer's first touch costs far more than a copy into a warm one)."""
    length = shard.numel() * world
    if length not in _GATHERED:
        _GATHERED[length] = torch.empty(length)
    dist.all_gather_single(_GATHERED[length], shard.contiguous())
    return _GATHERED[length]


class ShardedEngine:
    """Runs one rank's part of each call of a model sharded over a process group."""

    def __init__(self, spec: ModelSpec, seed: int = 0, *, rank: int, world: int):
        self.local = Engine(spec, seed)
        self.spec = spec
        self.shard = Shard(rank, world, self.local.numel)
        self.numel = self.shard.size                    #: length of each rank's buffers
        self.optimizer_numel = 2 * self.numel + 1
        self.pad_id = self.local.pad_id

    def initial_weights(self) -> torch.Tensor:
        return self.shard.take(self.local.initial_weights())

    def full(self, weights: torch.Tensor) -> torch.Tensor:
        """The whole flat weights (a view of the gather workspace, valid until the next call)."""
        _check_flat(weights, self.numel, "weights")
        return _gather_into(weights, self.shard.world)[:self.local.numel]

    # --- calls: each returns this rank's rows; the group's driver joins them -----------------

    def logprobs(self, weights, input_ids, attention_mask=None, *, temperature=1.0,
                 target_tokens=None):
        full = self.full(weights)
        rows = self.shard.rows(len(input_ids))
        return self.local.logprobs(full, _rows(input_ids, rows), _rows(attention_mask, rows),
                                   temperature=temperature,
                                   target_tokens=_rows(target_tokens, rows))

    def values(self, weights, input_ids, attention_mask=None) -> np.ndarray:
        full = self.full(weights)
        rows = self.shard.rows(len(input_ids))
        return self.local.values(full, _rows(input_ids, rows), _rows(attention_mask, rows))

    def generate(self, weights, prompts, *, rows: slice = slice(None),
                 **kw) -> dict[str, np.ndarray]:
        """This rank's share of ``rows`` (a rollout lane's rows; all by default)."""
        full = self.full(weights)
        start, stop, _ = rows.indices(len(prompts))
        mine = self.shard.rows(stop - start)
        return self.local.generate(full, prompts, rows=slice(start + mine.start, start + mine.stop),
                                   **kw)

    def forward_backward(self, weights, grads, batch, loss: str, **loss_args):
        """Add this rank's slice of d(loss)/d(weights) of the whole batch into ``grads``;
        returns the whole batch's loss and metrics (the same on every rank)."""
        _check_flat(grads, self.numel, "grads")
        _whole_rows_only(batch)
        full = self.full(weights)
        size = len(batch["input_ids"])
        rows = self.shard.rows(size)
        if "num_tokens" not in loss_args and "loss_mask" in batch:
            loss_args["num_tokens"] = float(np.asarray(batch["loss_mask"]).sum())
        scale = 1.0
        if rows.start == rows.stop:   # no rows here: run one row at weight 0, so every rank
            rows, scale = slice(0, 1), 0.0   # reduces the same gradients in the same order
        mine = {k: _rows(v, rows) if _is_batched(v, size) else v for k, v in batch.items()}
        with self.local.loss_of(full, mine, loss, loss_args) as (result, params, _):
            hooks = [params[s.name].register_post_accumulate_grad_hook(self._reducer(s, grads))
                     for s in self.local.layout]
            try:
                (result.loss * scale).backward()
            finally:
                for hook in hooks:
                    hook.remove()
        return self._reduced(result, scale)

    def forward_loss(self, weights, batch, loss: str, **loss_args):
        _whole_rows_only(batch)
        raise ValueError("a loss without gradients (Tinker's forward) on a group of "
                         f"{self.shard.world} devices is not served yet; bind the job to a "
                         "one-device worker group")

    def _reducer(self, slot, grads: torch.Tensor):
        """A hook that sums one parameter's gradient over the ranks and keeps this rank's
        slice of it in ``grads``."""
        lo, hi = max(slot.offset, self.shard.lo), min(slot.offset + slot.numel, self.shard.hi)

        def reduce(leaf: torch.Tensor) -> None:
            grad = leaf.grad.reshape(-1)
            dist.all_reduce(grad)
            if lo < hi:
                grads[lo - self.shard.lo:hi - self.shard.lo].add_(
                    grad[lo - slot.offset:hi - slot.offset])
            leaf.grad = None
        return reduce

    def _reduced(self, result, scale: float) -> dict[str, float]:
        """The whole batch's loss (the ranks' sum) and metrics: ``num_tokens`` summed, the
        others (means over a rank's tokens) weighted by each rank's tokens."""
        metrics = dict(result.metrics)
        tokens = metrics.get("num_tokens", 1.0) * scale
        keys = sorted(k for k in metrics if k != "num_tokens")
        vector = torch.tensor([float(result.loss.detach()) * scale, tokens]
                              + [metrics[k] * tokens for k in keys], dtype=torch.float64)
        dist.all_reduce(vector)
        out = {"loss": float(vector[0])}
        if "num_tokens" in metrics:
            out["num_tokens"] = float(vector[1])
        out.update({k: float(vector[2 + i] / vector[1]) if vector[1] else 0.0
                    for i, k in enumerate(keys)})
        return out

    def optim_step(self, weights, grads, optimizer, *, lr, betas=(0.9, 0.999), eps=1e-8,
                   weight_decay=0.0, max_grad_norm=None) -> dict[str, float]:
        """AdamW on this rank's shards; the gradient norm is that of the whole gradient."""
        _check_flat(weights, self.numel, "weights")
        _check_flat(grads, self.numel, "grads")
        _check_flat(optimizer, self.optimizer_numel, "optimizer")
        squares = grads.double().square().sum().reshape(1)
        dist.all_reduce(squares)
        grad_norm = float(squares.sqrt())
        if max_grad_norm is not None:
            grads.mul_(min(max_grad_norm / (grad_norm + 1e-6), 1.0))
        n = self.numel
        _adamw(weights, grads, optimizer[:n], optimizer[n:2 * n], optimizer[2 * n:], lr=lr,
               beta1=betas[0], beta2=betas[1], eps=eps, weight_decay=weight_decay)
        grads.zero_()
        return {"grad_norm": grad_norm, "step": float(optimizer[2 * n].item())}

    # --- whole States, for SAVE and LOAD (a checkpoint does not depend on the world size) ---

    def gather_state(self, buffer: torch.Tensor, optimizer: bool = False,
                     on_copy_thread: bool = False) -> torch.Tensor | None:
        """The whole flat State on rank 0 (None on the others), laid out as one device
        holds it; ``on_copy_thread`` gathers over the copy thread's process group."""
        parts = [torch.empty_like(buffer) for _ in range(self.shard.world)] \
            if self.shard.rank == 0 else None
        dist.gather(buffer.contiguous(), parts, dst=0,
                    group=_COPY_GROUP if on_copy_thread else None)
        if parts is None:
            return None
        n, size = self.local.numel, self.numel
        if not optimizer:
            return torch.cat(parts)[:n]
        first = torch.cat([p[:size] for p in parts])[:n]
        second = torch.cat([p[size:2 * size] for p in parts])[:n]
        return torch.cat([first, second, parts[0][2 * size:]])

    def take_state(self, full: torch.Tensor, optimizer: bool = False) -> torch.Tensor:
        """This rank's share of a whole flat State laid out as one device holds it."""
        if not optimizer:
            return self.shard.take(full)
        n = self.local.numel
        return torch.cat([self.shard.take(full[:n]), self.shard.take(full[n:2 * n]),
                          full[2 * n:]])

    # --- sizes -------------------------------------------------------------------------------

    def kv_bytes(self, batch: int, prompt_len: int, max_tokens: int) -> int:
        return self.local.kv_bytes(batch, prompt_len, max_tokens)

    def activation_bytes(self, batch: int, seq_len: int) -> int:
        return self.local.activation_bytes(batch, seq_len)


def _whole_rows_only(batch) -> None:
    if "target_tokens" in batch:   # the per-token outputs would stay split over the ranks
        raise ValueError("per-token outputs of target_tokens (Tinker's forward_backward) on a "
                         "sharded group are not served yet; bind the job to a one-device "
                         "worker group")


def _rows(array, rows: slice):
    return None if array is None else np.asarray(array)[rows]


def _is_batched(value, size: int) -> bool:
    return isinstance(value, (np.ndarray, list, tuple, torch.Tensor)) and \
        len(value) == size and np.ndim(value) >= 1

