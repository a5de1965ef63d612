"""GRPO end to end on the local runtime: a tiny-qwen2 policy, a short supervised warm-up,
then GRPO on the easiest own-generator task (copy a 2-3 digit string); the reward rises."""

from __future__ import annotations

import time

import numpy as np

from plexrl.rl.grpo import GRPOConfig, greedy_accuracy, train
from plexrl.rl.sft import supervised_warmup
from plexrl.rl.tasks import DigitTask
from plexrl.rl.tokenizers import CharTokenizer
from plexrl.runtime.models import model_spec

WARMUP_STEPS, GRPO_STEPS = 30, 60


def test_grpo_on_the_local_runtime_raises_reward_and_greedy_accuracy(connect):
    task = DigitTask("copy", 2, 3)
    tok = CharTokenizer.for_tasks(task)
    spec = model_spec("policy", source="tiny-qwen2")
    tok.check_fits(spec.vocab_size)
    job = connect().register_job("rl-copy", {"policy": spec}, seed=0)
    held = task.sample(200, seed=0, split="heldout")
    _, version = supervised_warmup(job, task, tok, WARMUP_STEPS, batch_size=32, lr=3e-3)
    before = greedy_accuracy(job, task, tok, held, version=version, max_tokens=6)
    start = time.monotonic()
    config = GRPOConfig(prompts_per_step=16, group_size=8, max_tokens=6, lr=1e-3)
    records = train(job, task, tok, config, GRPO_STEPS, start_version=version)
    seconds = time.monotonic() - start
    after = greedy_accuracy(job, task, tok, held, version=records[-1].version, max_tokens=6)
    rewards = [r.reward_mean for r in records]
    fifth = GRPO_STEPS // 5
    first, last = np.mean(rewards[:fifth]), np.mean(rewards[-fifth:])
    print(f"\nwarm-up {WARMUP_STEPS} steps: greedy accuracy {before:.3f}; GRPO {GRPO_STEPS} "
          f"steps in {seconds:.1f} s: reward first 20% {first:.3f} -> last 20% {last:.3f}; "
          f"greedy accuracy {after:.3f}")
    print("rewards", " ".join(f"{r:.2f}" for r in rewards))
    assert before <= 0.8
    assert last >= first + 0.1
    assert after >= before + 0.1
    assert records[-1].version == version + GRPO_STEPS
    job.end()
