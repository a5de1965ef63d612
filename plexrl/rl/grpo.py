"""GRPO with the DAPO options, written only against the client: config, pure numpy pieces,
one training loop and a greedy evaluation.

How this departs from the textbook GRPO (DeepSeekMath, Shao et al. 2024):

- **Token-level aggregation** (DAPO): the loss averages over every completion token of the
  batch, not over per-sequence means, so long completions weigh in proportion to length (the
  ``grpo`` loss in ``plexrl.losses.policy`` does this).
- **Asymmetric clip** (DAPO's clip-higher): the ratio is clipped to ``[1 - eps_low,
  1 + eps_high]``, 0.2 / 0.28 by default; set ``eps_high = eps_low`` for the textbook clip.
- **No reference model by default**: ``kl_coef = 0`` (DAPO, Dr. GRPO); with ``kl_coef > 0``
  the job needs a ``reference`` model and the loss adds the k3 KL estimator per token.
- **Std normalisation is an option** (``scale_rewards``, on by default as in the paper and
  TRL; Dr. GRPO turns it off). The std is the sample std (ddof=1, as torch and TRL), plus
  ``1e-6``.
- **One update per batch**: each batch is used for exactly one FORWARD_BACKWARD and one
  OPTIM_STEP (mu = 1), so the importance ratio is 1 up to numerics unless the rollout copy
  lags (``staleness = 1``); the clip matters only then. Old logprobs are recomputed by the
  trainer copy (LOGPROBS), not taken from the sampler.
- **Dynamic sampling** (DAPO, optional): groups whose total rewards are all equal carry no
  signal and are dropped; up to ``max_resamples`` extra GENERATE rounds refill the batch. A
  step that keeps no group makes no update (the weight version does not advance).
- **Overlong penalty** (DAPO's soft overlong punishment, optional): a completion longer than
  ``max_tokens - overlong_buffer`` tokens (its eos counted) loses up to ``overlong_penalty``
  linearly, the whole of it at ``max_tokens``. Truncated completions are not masked out.
- Rewards are TRL-style functions (``plexrl.rl.rewards``); the reward is their weighted sum
  (NaN skipped) plus the overlong penalty. ``accuracy`` is always the task's own verifier.

Owns: ``GRPOConfig``, ``group_advantages``, ``overlong_penalty``, ``keep_groups``,
``build_batch``, ``train``, ``greedy_accuracy``. Must not know: the runtime, torch, ray,
how a call is scheduled or where weights live.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from plexrl.errors import ConfigError
from plexrl.protocol import Role
from plexrl.rl.rewards import Rewards, TrainerState, verifier_reward
from plexrl.rl.tasks.base import Item

STD_EPS = 1e-6


@dataclass(frozen=True)
class GRPOConfig:
    prompts_per_step: int = 8        #: groups per step (distinct prompts)
    group_size: int = 8              #: completions sampled per prompt
    max_tokens: int = 16             #: completion length cap, eos included
    temperature: float = 1.0         #: sampling temperature (> 0); losses use the same
    top_p: float = 1.0
    lr: float = 1e-3                 #: AdamW learning rate
    max_grad_norm: float | None = 1.0
    eps_low: float = 0.2             #: ratio clip below 1
    eps_high: float = 0.28           #: ratio clip above 1 (DAPO clip-higher; 0.2 = textbook)
    kl_coef: float = 0.0             #: 0: no reference model
    scale_rewards: bool = True       #: divide advantages by the group's reward std
    dynamic_sampling: bool = False   #: drop groups whose rewards are all equal (DAPO)
    max_resamples: int = 2           #: extra GENERATE rounds to refill dropped groups
    overlong_buffer: int = 0         #: tokens before max_tokens where the penalty starts; 0 off
    overlong_penalty: float = 1.0    #: penalty at max_tokens
    seed: int = 0                    #: seeds the prompts each step draws

    def __post_init__(self):
        checks = {"group_size": self.group_size >= 2, "prompts_per_step": self.prompts_per_step
                  >= 1, "max_tokens": self.max_tokens >= 1, "temperature": self.temperature > 0,
                  "eps_low": 0 <= self.eps_low < 1, "eps_high": self.eps_high >= 0,
                  "kl_coef": self.kl_coef >= 0, "max_resamples": self.max_resamples >= 0,
                  "overlong_buffer": 0 <= self.overlong_buffer <= self.max_tokens}
        for name, ok in checks.items():
            if not ok:
                raise ConfigError("out of range", field=f"grpo.{name}",
                                  value=getattr(self, name))

    @classmethod
    def dapo(cls, **overrides) -> "GRPOConfig":
        """DAPO's choices: clip-higher, dynamic sampling, overlong penalty, no KL."""
        base = cls(**overrides)
        return replace(base, **{"eps_high": 0.28, "dynamic_sampling": True, "kl_coef": 0.0,
                                "overlong_buffer": max(1, base.max_tokens // 4), **overrides})


# -- pure pieces ---------------------------------------------------------------------------

def group_advantages(rewards, group_size: int, *, scale: bool = True) -> np.ndarray:
    """(r - mean of its group) [/ (sample std of its group + 1e-6)], flat like ``rewards``.

    ``rewards`` is flat (groups laid out one after another) with a length divisible by
    ``group_size``; a group of equal rewards gets advantage 0 everywhere.
    """
    r = np.asarray(rewards, dtype=np.float64).reshape(-1, group_size)
    centred = r - r.mean(axis=1, keepdims=True)
    if scale:
        centred = centred / (r.std(axis=1, ddof=1, keepdims=True) + STD_EPS)
    return centred.reshape(-1).astype(np.float32)


def overlong_penalty(lengths, max_tokens: int, buffer: int, penalty: float) -> np.ndarray:
    """DAPO's soft overlong punishment, <= 0 per completion of ``lengths`` tokens."""
    lengths = np.asarray(lengths, dtype=np.float64)
    if buffer <= 0:
        return np.zeros_like(lengths)
    exceed = lengths - (max_tokens - buffer)
    return np.minimum(-exceed / buffer * penalty, 0.0)


def keep_groups(rewards, group_size: int) -> np.ndarray:
    """Per group: True unless all its rewards are equal (DAPO's dynamic-sampling filter)."""
    r = np.asarray(rewards, dtype=np.float64).reshape(-1, group_size)
    return ~np.isclose(r.max(axis=1), r.min(axis=1), rtol=0.0, atol=1e-9)


def build_batch(prompt_ids: Sequence[Sequence[int]], gen: dict, pad_id: int) -> dict:
    """Prompt + completion per row, right-padded, as the losses read it.

    ``loss_mask`` marks completion tokens (a closing eos included); ``old_logprobs`` holds
    the sampler's logprob of completion token j at column len(prompt) + j, the column at
    which LOGPROBS reports that token, 0 elsewhere.
    """
    lengths = np.asarray(gen["lengths"])
    widths = [len(p) + int(n) for p, n in zip(prompt_ids, lengths)]
    shape = (len(widths), max(widths))
    ids = np.full(shape, pad_id, dtype=np.int64)
    attention = np.zeros(shape, dtype=np.int64)
    loss_mask = np.zeros(shape, dtype=np.float32)
    old = np.zeros(shape, dtype=np.float32)
    for i, (prompt, n) in enumerate(zip(prompt_ids, lengths)):
        p, n = len(prompt), int(n)
        ids[i, :p], ids[i, p:p + n] = prompt, gen["tokens"][i, :n]
        attention[i, :p + n] = 1
        loss_mask[i, p:p + n] = 1.0
        old[i, p:p + n] = gen["logprobs"][i, :n]
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask,
            "old_logprobs": old}


# -- the loop ------------------------------------------------------------------------------

@dataclass
class StepRecord:
    step: int                  #: index of this training step
    version: int               #: weight version after the step
    reward_mean: float         #: mean total reward of every completion generated
    accuracy: float            #: mean verifier score of every completion generated
    kept_groups: int           #: groups trained on
    num_groups: int            #: groups generated (over all GENERATE rounds)
    completion_len: float      #: mean completion tokens, eos included
    step_s: float              #: wall seconds of the step
    loss: dict = field(default_factory=dict)      #: FORWARD_BACKWARD metrics
    rewards: dict = field(default_factory=dict)   #: per reward function mean


@dataclass
class _Rollout:
    """One GENERATE round: its items (one per row), prompts, results and rewards."""

    items: list[Item]
    prompt_ids: list[list[int]]
    gen: dict
    reward: np.ndarray
    accuracy: np.ndarray
    per_function: np.ndarray


def train(job, task, tokenizer, config: GRPOConfig, steps: int, *,
          rewards: Rewards | None = None, start_version: int = 0,
          on_step: Callable[[StepRecord], None] | None = None) -> list[StepRecord]:
    """Run ``steps`` GRPO steps of ``job`` (a JobClient) on ``task``; one record a step.

    Per step: GENERATE -> rewards -> advantages -> LOGPROBS (old; reference if kl_coef) ->
    FORWARD_BACKWARD("grpo") -> OPTIM_STEP -> SYNC_WEIGHTS. ``start_version`` is the weight
    version installed when the loop starts (the updates a warm-up made).
    """
    rewards = rewards or Rewards([verifier_reward(task)])
    version, records = start_version, []
    for step in range(steps):
        start = time.monotonic()
        state = TrainerState(global_step=step, max_steps=steps)
        rounds = _collect(job, task, tokenizer, config, rewards, step, version, state)
        kept = [(r, g) for r in rounds for g in np.flatnonzero(_kept(r, config))]
        kept = kept[:config.prompts_per_step]
        loss = {}
        if kept:
            loss = _update(job, config, tokenizer, kept, version)
            version += 1
        records.append(_record(step, version, rounds, rewards, len(kept), loss,
                               time.monotonic() - start, config.group_size))
        if on_step:
            on_step(records[-1])
    return records


def _collect(job, task, tokenizer, config, rewards, step, version, state) -> list[_Rollout]:
    """One GENERATE round, and more while dynamic sampling leaves the batch short."""
    rounds, kept = [], 0
    for attempt in range(1 + (config.max_resamples if config.dynamic_sampling else 0)):
        seed = (config.seed * 1_000_003 + step) * 17 + attempt
        rounds.append(_rollout(job, task, tokenizer, config, rewards, seed, version, state))
        kept += int(_kept(rounds[-1], config).sum())
        if kept >= config.prompts_per_step:
            break
    return rounds


def _rollout(job, task, tokenizer, config, rewards, seed, version, state) -> _Rollout:
    g = config.group_size
    items = [it for it in task.sample(config.prompts_per_step, seed) for _ in range(g)]
    prompt_ids = [tokenizer.encode(it.prompt) for it in items]
    gen = job.generate(prompt_ids, step=version, max_tokens=config.max_tokens,
                       temperature=config.temperature, top_p=config.top_p,
                       stop=(tokenizer.eos_id,)).result()
    ids = [gen["tokens"][i, :n].tolist() for i, n in enumerate(gen["lengths"])]
    completions = [tokenizer.decode(row) for row in ids]
    columns = {"answer": [it.answer for it in items]}
    for key in items[0].columns:
        columns[key] = [it.columns[key] for it in items]
    per_function = rewards.per_function(prompts=[it.prompt for it in items],
                                        completions=completions, completion_ids=ids,
                                        columns=columns, trainer_state=state)
    reward = rewards.combine(per_function) + overlong_penalty(
        gen["lengths"], config.max_tokens, config.overlong_buffer, config.overlong_penalty)
    accuracy = np.array([task.score(it, c) for it, c in zip(items, completions)])
    return _Rollout(items, prompt_ids, gen, reward, accuracy, per_function)


def _kept(rollout: _Rollout, config: GRPOConfig) -> np.ndarray:
    if not config.dynamic_sampling:
        return np.ones(len(rollout.items) // config.group_size, dtype=bool)
    return keep_groups(rollout.reward, config.group_size)


def _update(job, config: GRPOConfig, tokenizer, kept, version: int) -> dict:
    """LOGPROBS, FORWARD_BACKWARD, OPTIM_STEP, SYNC_WEIGHTS on the kept groups."""
    g = config.group_size
    rows = [(r, i) for r, grp in kept for i in range(grp * g, grp * g + g)]
    prompt_ids = [r.prompt_ids[i] for r, i in rows]
    gen = {key: np.stack([r.gen[key][i] for r, i in rows])
           for key in ("tokens", "lengths", "logprobs")}
    advantages = np.concatenate([group_advantages(r.reward[grp * g:grp * g + g], g,
                                                  scale=config.scale_rewards)
                                 for r, grp in kept])
    batch = build_batch(prompt_ids, gen, tokenizer.pad_id)
    temperature = config.temperature
    batch["old_logprobs"] = job.logprobs(batch, step=version,
                                         temperature=temperature).result()["logprobs"]
    if config.kl_coef:
        batch["ref_logprobs"] = job.logprobs(batch, role=Role.REFERENCE, step=version,
                                             temperature=temperature).result()["logprobs"]
    metrics = job.forward_backward({**batch, "advantages": advantages}, loss="grpo",
                                   step=version, eps_low=config.eps_low,
                                   eps_high=config.eps_high, kl_coef=config.kl_coef,
                                   temperature=temperature).result()
    hyper = {} if config.max_grad_norm is None else {"max_grad_norm": config.max_grad_norm}
    optim = job.optim_step(lr=config.lr, step=version, **hyper)
    job.sync_weights(step=version).result()
    optim.result()
    return dict(metrics)


def _record(step, version, rounds, rewards, kept, loss, step_s, group_size) -> StepRecord:
    reward = np.concatenate([r.reward for r in rounds])
    per_function = np.concatenate([r.per_function for r in rounds], axis=1)
    lengths = np.concatenate([r.gen["lengths"] for r in rounds])
    accuracy = np.concatenate([r.accuracy for r in rounds])
    return StepRecord(step=step, version=version, reward_mean=float(reward.mean()),
                      accuracy=float(accuracy.mean()), kept_groups=kept,
                      num_groups=len(reward) // group_size, completion_len=float(lengths.mean()),
                      step_s=step_s, loss=loss, rewards=rewards.means(per_function))


def greedy_accuracy(job, task, tokenizer, items: Sequence[Item], *, version: int,
                    max_tokens: int, batch_size: int = 200) -> float:
    """Mean verifier score of greedy (temperature 0) completions of ``items``, sampled with
    weight version ``version``."""
    scores = []
    for start in range(0, len(items), batch_size):
        chunk = list(items[start:start + batch_size])
        gen = job.generate([tokenizer.encode(it.prompt) for it in chunk], step=version,
                           max_tokens=max_tokens, temperature=0.0,
                           stop=(tokenizer.eos_id,)).result()
        scores += [task.score(it, tokenizer.decode(gen["tokens"][i, :gen["lengths"][i]]))
                   for i, it in enumerate(chunk)]
    return float(np.mean(scores)) if scores else float("nan")
