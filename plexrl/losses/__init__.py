"""Loss functions that an engine runs by name.

Owns: the registry ``LOSSES`` (name -> LossFn) and ``get_loss``. A job sends a loss's name
and keyword arguments, never code. Each LossFn says which model head it needs ("lm": it
sees token logprobs; "value": it sees values) and which batch keys it reads; the calling
convention is in ``base``. May import torch; is not the runtime (no ray, no actors, no
scheduling) and does not import ``plexrl.runtime``.

    cross_entropy  SFT: mean negative logprob over loss_mask tokens     (policy.py)
    grpo           clipped importance ratio, asymmetric clip, k3 KL     (policy.py)
    importance_sampling  Tinker's: unclipped ratio x advantage          (policy.py)
    ppo            Tinker's: the ratio clipped to [0.8, 1.2]            (policy.py)
    cispo          the clipped ratio, detached, weighting logprob x A   (policy.py)
    value          PPO's clipped value MSE                              (value.py)
"""

from __future__ import annotations

from plexrl.errors import ConfigError
from plexrl.losses import policy, value
from plexrl.losses.base import LossFn, LossResult

LOSSES: dict[str, LossFn] = {fn.name: fn for fn in (*policy.LOSSES, *value.LOSSES)}


def get_loss(name: str) -> LossFn:
    """The loss called ``name``; a ConfigError listing the known names otherwise."""
    try:
        return LOSSES[name]
    except KeyError:
        raise ConfigError("unknown loss", field="loss", value=name,
                          fix=f"use one of {sorted(LOSSES)}") from None


__all__ = ["LOSSES", "LossFn", "LossResult", "get_loss"]
