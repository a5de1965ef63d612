"""The value loss of PPO: clipped mean-squared error of the value head against returns.

Owns: the per-token value loss and its metrics. Must not know how values or returns were
computed (GAE, Monte Carlo) or which engine ran the value model.
"""

from __future__ import annotations

import torch

from plexrl.losses.base import LossFn, LossResult, aggregate, as_float, masked_mean


def value(values: torch.Tensor, batch: dict[str, torch.Tensor], *, clip: float = 0.2,
          num_tokens: float | None = None) -> LossResult:
    """0.5 * max((v - R)^2, (v_clipped - R)^2), v_clipped within ``clip`` of old_values."""
    mask = as_float(batch, "loss_mask", values)
    returns = as_float(batch, "returns", values)
    old = as_float(batch, "old_values", values)
    v_clipped = old + (values - old).clamp(-clip, clip)
    unclipped = (values - returns) ** 2
    clipped = (v_clipped - returns) ** 2
    loss = aggregate(0.5 * torch.maximum(unclipped, clipped), mask, num_tokens)
    return LossResult(loss, {"num_tokens": float(mask.sum()),
                             "clip_frac": masked_mean((clipped > unclipped).float(), mask),
                             "value_mean": masked_mean(values, mask)})


LOSSES = (LossFn("value", "value", ("loss_mask", "returns", "old_values"), value),)
