"""Run your own job on PlexRL: a tiny policy learns, by GRPO, to prefer small token ids.

The job is written against the client only: it registers its model, then calls GENERATE,
LOGPROBS, FORWARD_BACKWARD, OPTIM_STEP and SYNC_WEIGHTS, each returning a future. Run it
with ``.venv/bin/python examples/own_job.py``; it starts the embedded local runtime (Ray on
loopback) and prints the mean reward of each step. ``--devices 2`` runs it on a worker group
of 2 devices, the model sharded over 2 ranks (the same rewards: tokens do not depend on n). Submitted with ``plexrl submit
examples/jobs/own-job.toml``, it attaches instead to the job the running controller placed
(``plexrl.client.connect_submitted``).
"""

from __future__ import annotations

import argparse

import numpy as np

import plexrl
from plexrl.client import connect_submitted
from plexrl.runtime.models import model_spec

PROMPTS = [[1, 5, 9], [1, 7], [1, 3, 4]]
GROUP = 4          # completions per prompt; advantages are normalised within each group


def batch_of(prompts, out) -> dict[str, np.ndarray]:
    """Prompt + completion per row, right-padded; the loss sees only completion tokens."""
    rows = [p + out["tokens"][i, :out["lengths"][i]].tolist() for i, p in enumerate(prompts)]
    ids = np.zeros((len(rows), max(map(len, rows))), dtype=np.int64)
    mask, loss_mask = np.zeros_like(ids), np.zeros(ids.shape, dtype=np.float32)
    for i, (prompt, row) in enumerate(zip(prompts, rows)):
        ids[i, :len(row)], mask[i, :len(row)], loss_mask[i, len(prompt):len(row)] = row, 1, 1
    return {"input_ids": ids, "attention_mask": mask, "loss_mask": loss_mask}


def main(steps: int = 15, seed: int = 0, address: str | None = None,
         devices: int | None = None) -> list[float]:
    submitted = connect_submitted()               # started by `plexrl submit`?
    if submitted is not None:
        runtime, job = submitted
    else:
        runtime = plexrl.connect(address, devices=devices)   # None: the embedded local runtime
        job = runtime.register_job("my-job", {"policy": model_spec("policy", source="tiny-qwen2")},
                                   seed=seed)
    prompts = [p for p in PROMPTS for _ in range(GROUP)]
    rewards_by_step = []
    for step in range(steps):
        out = job.generate(prompts, step=step, max_tokens=8, temperature=1.0).result()
        rewards = np.array([np.mean(out["tokens"][i, :n] < 32)
                            for i, n in enumerate(out["lengths"])]).reshape(-1, GROUP)
        advantages = (rewards - rewards.mean(1, keepdims=True)) / (rewards.std(1, keepdims=True) + 1e-6)
        batch = batch_of(prompts, out)
        old = job.logprobs(batch, step=step).result()["logprobs"]
        job.forward_backward({**batch, "old_logprobs": old,
                              "advantages": advantages.reshape(-1).astype(np.float32)},
                             loss="grpo", step=step).result()
        job.optim_step(lr=2e-2, step=step).result()
        job.sync_weights(step=step).result()       # the next GENERATE samples the new weights
        rewards_by_step.append(float(rewards.mean()))
        print(f"step {step:2d}  reward {rewards_by_step[-1]:.3f}", flush=True)
    job.end()
    runtime.close()
    return rewards_by_step


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--devices", type=int, default=None,
                        help="one worker group of this many devices (the model sharded over them)")
    args = parser.parse_args()
    main(steps=args.steps, seed=args.seed, devices=args.devices)
