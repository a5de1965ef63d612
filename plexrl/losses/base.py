"""What every loss shares: the LossFn record, its result, and token-level aggregation.

Owns: the calling convention between an engine and a loss. A loss gets the model's
per-token outputs (token logprobs for an "lm" loss, values for a "value" loss, both (B, T)
torch tensors carrying autograd history), the batch as torch tensors, and its keyword
arguments; it returns a scalar loss and float metrics. Must not know how the outputs were
computed, where weights live, or anything of the runtime (no ray, no plexrl.runtime).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Callable

import torch

from plexrl.errors import ConfigError


@dataclass(frozen=True)
class LossResult:
    """A loss's scalar (differentiable) and its metrics (plain floats, means over tokens)."""

    loss: torch.Tensor
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class LossFn:
    """One loss, chosen by name: what it reads and the function that computes it."""

    name: str
    head: str                    #: "lm": sees token logprobs (B, T); "value": values (B, T)
    needs: tuple[str, ...]       #: batch keys it reads besides input_ids / attention_mask
    fn: Callable[..., LossResult]

    def __call__(self, outputs: torch.Tensor, batch: dict[str, torch.Tensor],
                 **args) -> LossResult:
        missing = [k for k in self.needs if k not in batch]
        if missing:
            raise ConfigError(f"loss {self.name!r} needs batch keys {missing}",
                              field="batch", value=sorted(batch))
        known = list(inspect.signature(self.fn).parameters)[2:]
        unknown = sorted(set(args) - set(known))
        if unknown:
            raise ConfigError(f"loss {self.name!r} takes no argument {unknown}",
                              field="loss_args", fix=f"use some of {known}")
        return self.fn(outputs, batch, **args)


def as_float(batch: dict[str, torch.Tensor], key: str, like: torch.Tensor) -> torch.Tensor:
    """``batch[key]`` as ``like``'s dtype; a (B,) tensor broadcasts over tokens as (B, 1)."""
    value = batch[key].to(like.dtype)
    return value[:, None] if value.dim() == 1 else value


def aggregate(per_token: torch.Tensor, mask: torch.Tensor,
              num_tokens: float | None) -> torch.Tensor:
    """Token-level aggregation: the masked sum over the batch over ``num_tokens``.

    ``num_tokens`` defaults to this batch's masked token count; passing a count shared by
    several micro-batches makes their gradients add up to the whole batch's.
    """
    count = float(mask.sum()) if num_tokens is None else float(num_tokens)
    return (per_token * mask).sum() / max(count, 1.0)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """The mean of ``values`` over this batch's masked tokens (0 when none), as a float."""
    count = float(mask.sum())
    return float((values.detach() * mask).sum()) / count if count else 0.0
