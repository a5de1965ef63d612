"""A short supervised warm-up: teach a fresh policy the answer format before GRPO.

Owns: ``sft_batch`` (prompt + reference answer + eos per row, the loss on answer and eos)
and ``supervised_warmup`` (FORWARD_BACKWARD("cross_entropy") -> OPTIM_STEP -> SYNC_WEIGHTS
per step). A tiny random model samples nothing a verifier accepts, so every GRPO group
would be all zeros; a few warm-up steps give it some right answers to reinforce.
Must not know: the runtime, torch, how calls are scheduled.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from plexrl.rl.tasks.base import Item


def sft_batch(items: Sequence[Item], tokenizer) -> dict[str, np.ndarray]:
    """Right-padded rows of encode(prompt) + encode(answer) + eos; ``loss_mask`` on the
    answer and its eos."""
    rows = [(tokenizer.encode(it.prompt), tokenizer.encode(it.answer, add_bos=False)
             + [tokenizer.eos_id]) for it in items]
    shape = (len(rows), max(len(p) + len(a) for p, a in rows))
    ids = np.full(shape, tokenizer.pad_id, dtype=np.int64)
    attention = np.zeros(shape, dtype=np.int64)
    loss_mask = np.zeros(shape, dtype=np.float32)
    for i, (p, a) in enumerate(rows):
        ids[i, :len(p) + len(a)] = p + a
        attention[i, :len(p) + len(a)] = 1
        loss_mask[i, len(p):len(p) + len(a)] = 1.0
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask}


def supervised_warmup(job, task, tokenizer, steps: int, *, batch_size: int = 32,
                      lr: float = 3e-3, seed: int = 0, start_version: int = 0,
                      on_step: Callable[[int, float], None] | None = None
                      ) -> tuple[list[float], int]:
    """``steps`` cross-entropy steps on training items; returns (nll per step, the weight
    version installed after them). ``on_step(step, nll)`` is called after each step."""
    nll, version = [], start_version
    for step in range(steps):
        items = task.sample(batch_size, seed=(seed * 1_000_003 + step) * 17 + 999)
        metrics = job.forward_backward(sft_batch(items, tokenizer), loss="cross_entropy",
                                       step=version).result()
        job.optim_step(lr=lr, step=version, max_grad_norm=1.0)
        job.sync_weights(step=version).result()
        version += 1
        nll.append(float(metrics.get("nll", metrics["loss"])))
        if on_step:
            on_step(step, nll[-1])
    return nll, version
