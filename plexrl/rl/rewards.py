"""Reward functions, called exactly as TRL's GRPOTrainer calls them, and their weighting.

Owns: the calling convention, ``TrainerState`` (what ``trainer_state`` carries), ``Rewards``
(several functions with weights) and ``verifier_reward`` (a task's exact verifier as a
TRL-style function). A reward function is called once per batch with keyword arguments only:

    prompts          list[str], one per completion (a prompt repeats over its group)
    completions      list[str], decoded up to eos, special tokens dropped
    completion_ids   list[list[int]], the sampled ids, a closing eos included
    <column>         list, one entry per completion, for every dataset column
                     (``answer`` and the item's ``columns``)
    trainer_state    TrainerState (``global_step``, ``max_steps``)

It returns one float (or None) per completion. None means "this function does not apply to
this completion"; as in TRL it becomes NaN, and the weighted sum over functions skips NaN
(``nansum``), so a completion no function scores gets reward 0.0. Per-function means skip NaN
as well.
Must not know: the client, tokenizers, models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from plexrl.errors import ConfigError

RewardFn = Callable[..., Sequence[float | None]]


@dataclass(frozen=True)
class TrainerState:
    """What TRL's ``trainer_state`` offers that a reward function here can read."""

    global_step: int       #: training steps done before this batch
    max_steps: int         #: steps this run will take


def verifier_reward(task) -> RewardFn:
    """The task's verifier as a TRL-style reward function (it rebuilds each item from the
    ``prompts``, ``answer`` and column keyword arguments)."""
    from plexrl.rl.tasks.base import Item

    def verifier(prompts, completions, answer, **columns):
        columns.pop("completion_ids", None)
        columns.pop("trainer_state", None)
        return [task.score(Item(p, a, {k: v[i] for k, v in columns.items()}), c)
                for i, (p, a, c) in enumerate(zip(prompts, answer, completions))]
    verifier.__name__ = f"verifier_{getattr(task, 'name', 'task')}"
    return verifier


class Rewards:
    """Reward functions with weights (1.0 each by default), called as TRL calls them."""

    def __init__(self, funcs: Sequence[RewardFn], weights: Sequence[float] | None = None):
        if not funcs:
            raise ConfigError("need at least one reward function", field="reward_funcs")
        weights = [1.0] * len(funcs) if weights is None else list(map(float, weights))
        if len(weights) != len(funcs):
            raise ConfigError("one weight per reward function", field="reward_weights",
                              value=weights)
        self.funcs, self.weights = list(funcs), np.asarray(weights, dtype=np.float64)
        names = [getattr(f, "__name__", "reward") for f in funcs]
        self.names = [n if names.count(n) == 1 else f"{n}_{i}" for i, n in enumerate(names)]

    def per_function(self, *, prompts: list[str], completions: list[str],
                     completion_ids: list[list[int]], columns: Mapping[str, list],
                     trainer_state: TrainerState) -> np.ndarray:
        """(num_funcs, N) rewards, NaN where a function returned None."""
        n = len(completions)
        out = np.full((len(self.funcs), n), np.nan)
        for f, (fn, name) in enumerate(zip(self.funcs, self.names)):
            values = fn(prompts=prompts, completions=completions,
                        completion_ids=completion_ids, trainer_state=trainer_state, **columns)
            values = list(values)
            if len(values) != n:
                raise ConfigError(f"reward function returned {len(values)} values for {n} "
                                  "completions", field="reward_funcs", value=name)
            out[f] = [math.nan if v is None else float(v) for v in values]
        return out

    def combine(self, per_function: np.ndarray) -> np.ndarray:
        """Weighted sum over functions, NaN skipped (TRL's ``nansum``): shape (N,)."""
        return np.nansum(per_function * self.weights[:, None], axis=0)

    def means(self, per_function: np.ndarray) -> dict[str, float]:
        """Each function's mean over the completions it scored (NaN when it scored none)."""
        out = {}
        for name, row in zip(self.names, per_function):
            scored = row[~np.isnan(row)]
            out[name] = float(scored.mean()) if scored.size else math.nan
        return out
