"""A GRPO-like training step written only against the client, for the runtime's tests.

Small on purpose: 2 prompts x a group of 2 completions of 6 tokens, so a call's device
workspace stays below the smallest State of a tiny model (the equivalence test sizes its
budget on that). Reward: the share of completion tokens below 32; advantages normalised in
each prompt's group.
"""

from __future__ import annotations

import numpy as np

PROMPTS = ([1, 5, 9], [1, 7])
GROUP = 2
MAX_TOKENS = 6


def batch_of(prompts, gen: dict, pad: int = 0) -> dict[str, np.ndarray]:
    """Prompt + completion per row, right-padded; ``loss_mask`` marks completion tokens."""
    rows = [list(p) + list(gen["tokens"][i, :gen["lengths"][i]]) for i, p in enumerate(prompts)]
    width = max(map(len, rows))
    ids = np.full((len(rows), width), pad, dtype=np.int64)
    attention = np.zeros_like(ids)
    loss_mask = np.zeros(ids.shape, dtype=np.float32)
    for i, (p, row) in enumerate(zip(prompts, rows)):
        ids[i, :len(row)] = row
        attention[i, :len(row)] = 1
        loss_mask[i, len(p):len(row)] = 1
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask}


def rewards_of(gen: dict) -> np.ndarray:
    return np.array([np.mean(gen["tokens"][i, :n] < 32) for i, n in enumerate(gen["lengths"])])


def step(job, k: int, *, lr: float = 1e-2) -> dict[str, np.ndarray]:
    """One full step: GENERATE, LOGPROBS, FORWARD_BACKWARD, OPTIM_STEP, SYNC_WEIGHTS."""
    prompts = [p for p in PROMPTS for _ in range(GROUP)]
    gen = job.generate(prompts, step=k, max_tokens=MAX_TOKENS, temperature=1.0).result()
    rewards = rewards_of(gen).reshape(len(PROMPTS), GROUP)
    advantages = ((rewards - rewards.mean(1, keepdims=True))
                  / (rewards.std(1, keepdims=True) + 1e-6)).reshape(-1).astype(np.float32)
    batch = batch_of(prompts, gen)
    old = job.logprobs(batch, step=k).result()["logprobs"]
    job.forward_backward({**batch, "old_logprobs": old, "advantages": advantages}, loss="grpo",
                         step=k).result()
    job.optim_step(lr=lr, step=k).result()
    job.sync_weights(step=k).result()
    return {"tokens": gen["tokens"], "gen_logprobs": gen["logprobs"], "old_logprobs": old,
            "reward": rewards.mean()}
