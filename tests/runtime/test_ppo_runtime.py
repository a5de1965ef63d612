"""PPO end to end on the local runtime: a tiny-qwen2 policy, a value model (head "value")
and a frozen reference in one job, sharing one worker group with a GRPO job; after a short
supervised warm-up, PPO on copying a 2-3 digit string raises the reward."""

from __future__ import annotations

import threading
import time

import numpy as np

from plexrl.rl.grpo import GRPOConfig
from plexrl.rl.grpo import train as grpo_train
from plexrl.rl.ppo import PPOConfig, freeze_reference, train
from plexrl.rl.sft import supervised_warmup
from plexrl.rl.tasks import DigitTask
from plexrl.rl.tokenizers import CharTokenizer
from plexrl.runtime.models import model_spec

WARMUP_STEPS, PPO_STEPS = 30, 40


def test_ppo_with_a_value_model_raises_reward_beside_a_grpo_job(connect, tmp_path):
    runtime = connect(groups=(("wg0", 1),))
    task = DigitTask("copy", 2, 3)
    tok = CharTokenizer.for_tasks(task)
    ppo = runtime.register_job("ppo", {
        "policy": model_spec("policy", source="tiny-qwen2"),
        "value": model_spec("value", source="tiny-qwen2", head="value"),
        "reference": model_spec("reference", source="tiny-qwen2", trainable=False)}, seed=0)
    grpo = runtime.register_job("grpo", {"policy": model_spec("policy", source="tiny-llama")},
                                seed=1)
    _, version = supervised_warmup(ppo, task, tok, WARMUP_STEPS, batch_size=32, lr=3e-3)
    freeze_reference(ppo, tmp_path)

    other = threading.Thread(target=grpo_train, args=(grpo, task, tok, GRPOConfig(
        prompts_per_step=4, group_size=4, max_tokens=6), 12))
    start = time.monotonic()
    other.start()
    config = PPOConfig(prompts_per_step=64, max_tokens=6, lr=1e-3, value_lr=3e-3,
                       kl_coef=0.02, epochs=2)
    records = train(ppo, task, tok, config, PPO_STEPS, start_version=version)
    other.join()
    seconds = time.monotonic() - start

    rewards = [r.reward_mean for r in records]
    fifth = PPO_STEPS // 5
    first, last = np.mean(rewards[:fifth]), np.mean(rewards[-fifth:])
    print(f"\nPPO {PPO_STEPS} steps in {seconds:.1f} s beside GRPO: reward first 20% "
          f"{first:.3f} -> last 20% {last:.3f}; kl {records[-1].kl:.4f}; value loss "
          f"{records[0].value['loss']:.4f} -> {records[-1].value['loss']:.4f}")
    print("rewards", " ".join(f"{r:.2f}" for r in rewards))
    assert last >= first + 0.1
    assert records[-1].version == version + PPO_STEPS * config.epochs

    calls = runtime.inspect("calls")
    ppo_calls = [c for c in calls if c["job"] == "ppo" and c["start_s"] >= start]
    assert {c["role"] for c in ppo_calls} == {"policy", "value", "reference"}
    assert {c["wg"] for c in calls} == {"wg0"}
    grpo_calls = [c for c in calls if c["job"] == "grpo"]
    window = (min(c["start_s"] for c in ppo_calls), max(c["end_s"] for c in ppo_calls))
    assert sum(window[0] < c["start_s"] < window[1] for c in grpo_calls) >= 10   # interleaved
    assert not any(c["failed"] for c in calls)
    ppo.end()
    grpo.end()
