"""Losses on token logprobs: supervised cross-entropy, GRPO's clipped surrogate, and the
policy-gradient losses by Tinker's names (``importance_sampling``, ``ppo``, ``cispo``).

Owns: the per-token policy losses and their metrics. Must not know how logprobs were
computed (temperature, model, engine) or where the batch came from.

How GRPO here departs from the PPO textbook:

- the clip is asymmetric (DAPO's "clip-higher"): the ratio is clipped to
  ``[1 - eps_low, 1 + eps_high]``, 0.2 and 0.28 by default;
- aggregation is token-level over all masked tokens of the batch (DAPO), not a mean of
  per-sequence means; ``num_tokens`` lets micro-batches share one normaliser;
- the KL penalty is optional (``kl_coef``, default 0) and uses the k3 estimator
  ``exp(ref - new) - (ref - new) - 1`` against ``ref_logprobs``;
- advantages may be per sequence (B,) or per token (B, T).

Tinker's losses are sums over tokens: with ``num_tokens=1`` every loss here is one, and
``cross_entropy`` with float ``loss_mask`` weights is Tinker's weighted ``cross_entropy``.
"""

from __future__ import annotations

import torch

from plexrl.errors import ConfigError
from plexrl.losses.base import LossFn, LossResult, aggregate, as_float, masked_mean


def cross_entropy(logprobs: torch.Tensor, batch: dict[str, torch.Tensor], *,
                  num_tokens: float | None = None) -> LossResult:
    """SFT: the mean negative logprob of the ``loss_mask`` tokens."""
    mask = as_float(batch, "loss_mask", logprobs)
    loss = aggregate(-logprobs, mask, num_tokens)
    return LossResult(loss, {"num_tokens": float(mask.sum()),
                             "nll": masked_mean(-logprobs, mask)})


def grpo(logprobs: torch.Tensor, batch: dict[str, torch.Tensor], *, eps_low: float = 0.2,
         eps_high: float = 0.28, kl_coef: float = 0.0,
         num_tokens: float | None = None) -> LossResult:
    """The clipped importance-ratio surrogate, with an optional k3 KL penalty."""
    mask = as_float(batch, "loss_mask", logprobs)
    advantages = as_float(batch, "advantages", logprobs)
    log_ratio = (logprobs - as_float(batch, "old_logprobs", logprobs)) * mask
    ratio = log_ratio.exp()
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped)
    kl = torch.zeros_like(per_token)
    if "ref_logprobs" in batch:
        delta = (as_float(batch, "ref_logprobs", logprobs) - logprobs) * mask
        kl = delta.exp() - delta - 1.0
    elif kl_coef:
        raise ConfigError("grpo with kl_coef needs ref_logprobs in the batch",
                          field="kl_coef", value=kl_coef)
    loss = aggregate(per_token + kl_coef * kl, mask, num_tokens)
    return LossResult(loss, {"num_tokens": float(mask.sum()),
                             "clip_frac": masked_mean((clipped > unclipped).float(), mask),
                             "ratio_mean": masked_mean(ratio, mask),
                             "kl": masked_mean(kl, mask)})


def importance_sampling(logprobs: torch.Tensor, batch: dict[str, torch.Tensor], *,
                        num_tokens: float | None = None) -> LossResult:
    """Tinker's importance-sampled REINFORCE: ``-ratio * advantage`` per token, the ratio
    ``exp(logprobs - old_logprobs)`` against the sampler's logprobs, unclipped."""
    mask = as_float(batch, "loss_mask", logprobs)
    ratio = ((logprobs - as_float(batch, "old_logprobs", logprobs)) * mask).exp()
    loss = aggregate(-as_float(batch, "advantages", logprobs) * ratio, mask, num_tokens)
    return LossResult(loss, {"num_tokens": float(mask.sum()), "ratio_mean": masked_mean(ratio, mask)})


def ppo(logprobs: torch.Tensor, batch: dict[str, torch.Tensor], *,
        clip_low_threshold: float = 0.8, clip_high_threshold: float = 1.2,
        num_tokens: float | None = None) -> LossResult:
    """Tinker's PPO: GRPO's clipped surrogate with the ratio clipped to
    ``[clip_low_threshold, clip_high_threshold]`` (Tinker's names and defaults), no KL."""
    return grpo(logprobs, batch, eps_low=1.0 - clip_low_threshold,
                eps_high=clip_high_threshold - 1.0, num_tokens=num_tokens)


def cispo(logprobs: torch.Tensor, batch: dict[str, torch.Tensor], *,
          clip_low_threshold: float = 0.8, clip_high_threshold: float = 1.2,
          num_tokens: float | None = None) -> LossResult:
    """CISPO: the clipped ratio, with no gradient through it, weights ``-logprobs *
    advantage`` per token (so a clipped token still gets a policy gradient)."""
    mask = as_float(batch, "loss_mask", logprobs)
    ratio = ((logprobs - as_float(batch, "old_logprobs", logprobs)) * mask).exp()
    weight = ratio.clamp(clip_low_threshold, clip_high_threshold).detach()
    loss = aggregate(-weight * logprobs * as_float(batch, "advantages", logprobs), mask,
                     num_tokens)
    return LossResult(loss, {"num_tokens": float(mask.sum()), "ratio_mean": masked_mean(ratio, mask),
                             "clip_frac": masked_mean((weight != ratio).float(), mask)})


_RL = ("loss_mask", "old_logprobs", "advantages")
LOSSES = (
    LossFn("cross_entropy", "lm", ("loss_mask",), cross_entropy),
    LossFn("grpo", "lm", _RL, grpo),
    LossFn("importance_sampling", "lm", _RL, importance_sampling),
    LossFn("ppo", "lm", _RL, ppo),
    LossFn("cispo", "lm", _RL, cispo),
)
