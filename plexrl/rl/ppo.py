"""PPO with a learned value model and a frozen reference, written only against the client.

A job has three models: the ``policy`` (trained, samples), the ``value`` model (trained,
``ModelSpec.head = "value"``: one scalar per token) and the ``reference`` (frozen, the
policy as the warm-up left it; ``freeze_reference`` copies it over with SAVE / LOAD).

How this departs from the textbook (Ouyang et al. 2022; TRL's PPOTrainer, OpenRLHF):

- **Token-level reward**: ``-kl_coef * (logp - ref_logp)`` on every sampled token (the k1
  estimator, as TRL), plus the verifier's score on the last sampled token. No reward model:
  the task's verifier is the reward.
- **GAE over sampled tokens only**: tool-result tokens (multi-turn rollouts) are the
  environment's, not actions; GAE runs over each row's sampled tokens in order, the value
  after the last one is 0 (the episode ends), ``gamma`` 1 and ``lam`` 0.95 by default.
- **Values are read one position early**: the value head's output at column t sees tokens
  <= t, so the value of the state in which token t is sampled is the output at t - 1; the
  value loss is laid out the same way (``value_batch``).
- **Old logprobs are the trainer copy's** (LOGPROBS before the update, as the GRPO loop),
  and the policy loss is the ``grpo`` loss of ``plexrl.losses`` with per-token advantages,
  a symmetric clip (``eps_low = eps_high = clip``) and ``kl_coef = 0`` (the KL is already
  in the reward): the PPO clipped surrogate with token-level aggregation.
- **Whole-batch epochs**: ``epochs`` updates of policy and value on the whole batch (no
  minibatches); advantages are whitened over the batch's sampled tokens.
- **Value clipping is optional** (``value_clip = None`` turns it off).

Owns: ``PPOConfig``, ``token_rewards``, ``gae``, ``whiten``, ``value_batch``,
``freeze_reference``, ``train``. Must not know: the runtime, torch, ray, where models live.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from plexrl.errors import ConfigError
from plexrl.protocol import Role
from plexrl.rl.rollout import completion_text, episode_batch, rollout
from plexrl.rl.tools import ToolBox

WHITEN_EPS = 1e-8


@dataclass(frozen=True)
class PPOConfig:
    prompts_per_step: int = 32       #: episodes per step (one per prompt)
    max_tokens: int = 8              #: model tokens per turn at most, eos included
    max_turns: int = 1               #: turns per episode (tool calls: max_turns - 1 at most)
    temperature: float = 1.0
    top_p: float = 1.0
    lr: float = 1e-3                 #: policy AdamW learning rate
    value_lr: float = 3e-3           #: value model AdamW learning rate
    max_grad_norm: float | None = 1.0
    gamma: float = 1.0               #: discount per sampled token
    lam: float = 0.95                #: GAE lambda
    kl_coef: float = 0.05            #: per-token KL penalty in the reward
    clip: float = 0.2                #: policy ratio clip, both sides
    value_clip: float | None = 0.2   #: clip of the value change; None: no clipping
    epochs: int = 2                  #: updates per batch
    whiten_advantages: bool = True
    seed: int = 0                    #: seeds the prompts each step draws

    def __post_init__(self):
        checks = {"prompts_per_step": self.prompts_per_step >= 1, "max_tokens":
                  self.max_tokens >= 1, "max_turns": self.max_turns >= 1, "temperature":
                  self.temperature > 0, "gamma": 0 <= self.gamma <= 1, "lam": 0 <= self.lam <= 1,
                  "kl_coef": self.kl_coef >= 0, "clip": 0 < self.clip < 1, "epochs":
                  self.epochs >= 1, "value_clip": self.value_clip is None or self.value_clip > 0}
        for name, ok in checks.items():
            if not ok:
                raise ConfigError("out of range", field=f"ppo.{name}", value=getattr(self, name))


# -- pure pieces ---------------------------------------------------------------------------

def token_rewards(scores, logprobs, ref_logprobs, mask, kl_coef: float) -> np.ndarray:
    """(B, T): ``-kl_coef * (logprobs - ref_logprobs)`` on masked tokens, plus each row's
    score on its last masked token (a row with no masked token gets nothing)."""
    mask = np.asarray(mask, dtype=np.float64)
    kl = (np.asarray(logprobs, np.float64) - np.asarray(ref_logprobs, np.float64)) * mask
    rewards = -kl_coef * kl
    for i, score in enumerate(np.asarray(scores, dtype=np.float64)):
        idx = np.flatnonzero(mask[i])
        if idx.size:
            rewards[i, idx[-1]] += score
    return rewards


def gae(rewards, values, mask, gamma: float, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """(advantages, returns), both (B, T), 0 off the mask. Per row, over its masked tokens
    t_1 < ... < t_n in order: delta_k = r_k + gamma * V_{k+1} - V_k (V_{n+1} = 0),
    A_k = delta_k + gamma * lam * A_{k+1}; returns = A + V."""
    rewards, values = np.asarray(rewards, np.float64), np.asarray(values, np.float64)
    advantages = np.zeros_like(rewards)
    for i in range(rewards.shape[0]):
        idx = np.flatnonzero(np.asarray(mask[i]))
        next_value = next_adv = 0.0
        for t in idx[::-1]:
            delta = rewards[i, t] + gamma * next_value - values[i, t]
            next_adv = delta + gamma * lam * next_adv
            next_value = values[i, t]
            advantages[i, t] = next_adv
    returns = (advantages + values) * (np.asarray(mask) > 0)
    return advantages, returns


def whiten(values, mask) -> np.ndarray:
    """(values - mean) / (std + 1e-8) over the masked entries; 0 off the mask."""
    values, on = np.asarray(values, np.float64), np.asarray(mask) > 0
    if not on.any():
        return np.zeros_like(values)
    mean, std = values[on].mean(), values[on].std()
    return np.where(on, (values - mean) / (std + WHITEN_EPS), 0.0)


def shift_right(x: np.ndarray) -> np.ndarray:
    """Column t holds column t - 1 (column 0 gets 0): value outputs -> values per action."""
    return np.concatenate([np.zeros_like(x[:, :1]), x[:, :-1]], axis=1)


def shift_left(x: np.ndarray) -> np.ndarray:
    """Column t holds column t + 1 (the last gets 0): per-action targets -> value outputs."""
    return np.concatenate([x[:, 1:], np.zeros_like(x[:, :1])], axis=1)


def value_batch(batch: dict, returns: np.ndarray, value_outputs: np.ndarray) -> dict:
    """The value loss's batch: the return of the action at column t is the target of the
    value output at t - 1, as are its mask and its old value."""
    mask = shift_left(batch["loss_mask"])
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
            "loss_mask": mask.astype(np.float32),
            "returns": (shift_left(returns) * mask).astype(np.float32),
            "old_values": (np.asarray(value_outputs) * mask).astype(np.float32)}


def freeze_reference(job, directory: str | Path) -> None:
    """Make the job's reference model the policy as it is now (SAVE, then LOAD into it)."""
    path = str(Path(directory) / f"{job.job}-reference.safetensors")
    job.save(path).result()
    job.load(path, role=Role.REFERENCE).result()


# -- the loop ------------------------------------------------------------------------------

@dataclass
class PPORecord:
    step: int                  #: index of this training step
    version: int               #: policy weight version after the step
    reward_mean: float         #: mean verifier score of the step's episodes
    kl: float                  #: mean per-token logp - ref_logp over sampled tokens
    value_mean: float          #: mean value of the sampled tokens' states, before the update
    completion_len: float      #: mean sampled tokens per episode
    step_s: float              #: wall seconds of the step
    policy: dict = field(default_factory=dict)    #: last epoch's policy FORWARD_BACKWARD
    value: dict = field(default_factory=dict)     #: last epoch's value FORWARD_BACKWARD
    tools: dict = field(default_factory=dict)     #: tool results per kind this step


def train(job, task, tokenizer, config: PPOConfig, steps: int, *, start_version: int = 0,
          toolbox: ToolBox | None = None,
          on_step: Callable[[PPORecord], None] | None = None) -> list[PPORecord]:
    """Run ``steps`` PPO steps of ``job`` (policy, value and reference models) on ``task``.

    Per step: rollout (GENERATE per turn, tools between) -> scores -> LOGPROBS of policy,
    reference and value -> token rewards, GAE -> ``epochs`` x (FORWARD_BACKWARD + OPTIM_STEP
    of policy and of value) -> SYNC_WEIGHTS of the policy. ``start_version`` is the policy
    version installed when the loop starts.
    """
    version, records = start_version, []
    for step in range(steps):
        start = time.monotonic()
        before = dict(toolbox.report.counts) if toolbox else {}
        items = task.sample(config.prompts_per_step, seed=config.seed * 1_000_003 + step)
        episodes = rollout(job, tokenizer, [tokenizer.encode(it.prompt) for it in items],
                           version=version, max_tokens=config.max_tokens, toolbox=toolbox,
                           max_turns=config.max_turns, temperature=config.temperature,
                           top_p=config.top_p)
        scores = np.array([task.score(it, completion_text(tokenizer, e))
                           for it, e in zip(items, episodes)])
        batch = episode_batch(episodes, tokenizer.pad_id)
        policy, value, stats = _update(job, config, batch, scores, version)
        version += config.epochs
        tools = {k: v - before.get(k, 0) for k, v in toolbox.report.counts.items()
                 if v - before.get(k, 0)} if toolbox else {}
        records.append(PPORecord(step, version, float(scores.mean()), stats["kl"],
                                 stats["value_mean"], float(batch["loss_mask"].sum(1).mean()),
                                 time.monotonic() - start, policy, value, tools))
        if on_step:
            on_step(records[-1])
    return records


def _update(job, config: PPOConfig, batch: dict, scores: np.ndarray, version: int):
    """Score the batch with the three models, then ``epochs`` updates and a sync."""
    t = config.temperature
    futures = (job.logprobs(batch, step=version, temperature=t),
               job.logprobs(batch, role=Role.REFERENCE, step=version, temperature=t),
               job.logprobs(batch, role=Role.VALUE, step=version))
    old, ref, outputs = (f.result() for f in futures)
    old, ref, outputs = old["logprobs"], ref["logprobs"], outputs["values"]
    mask = batch["loss_mask"]
    values = shift_right(outputs) * mask
    rewards = token_rewards(scores, old, ref, mask, config.kl_coef)
    advantages, returns = gae(rewards, values, mask, config.gamma, config.lam)
    if config.whiten_advantages:
        advantages = whiten(advantages, mask)
    policy_batch = {**batch, "old_logprobs": old, "advantages": advantages.astype(np.float32)}
    critic_batch = value_batch(batch, returns, outputs)
    hyper = {} if config.max_grad_norm is None else {"max_grad_norm": config.max_grad_norm}
    value_clip = float("inf") if config.value_clip is None else config.value_clip
    pending, steps = [], []
    for _ in range(config.epochs):
        pending.append((job.forward_backward(policy_batch, loss="grpo", step=version,
                                             eps_low=config.clip, eps_high=config.clip,
                                             kl_coef=0.0, temperature=t),
                        job.forward_backward(critic_batch, loss="value", role=Role.VALUE,
                                             step=version, clip=value_clip)))
        steps += [job.optim_step(lr=config.lr, step=version, **hyper),
                  job.optim_step(lr=config.value_lr, role=Role.VALUE, step=version, **hyper)]
    job.sync_weights(step=version).result()
    for optim in steps:
        optim.result()
    policy, value = (dict(f.result()) for f in pending[-1])
    on = mask > 0
    stats = {"kl": float((old - ref)[on].mean()) if on.any() else 0.0,
             "value_mean": float(values[on].mean()) if on.any() else 0.0}
    return policy, value, stats
