"""PPO pieces against hand-computed values, and the loop on a mock transport: which verbs,
on which models, in which order, with which batches."""

from __future__ import annotations

import numpy as np
import pytest

import plexrl
from plexrl.errors import ConfigError
from plexrl.protocol import Function, Role
from plexrl.rl.ppo import (PPOConfig, freeze_reference, gae, shift_right, token_rewards, train,
                           value_batch, whiten)
from plexrl.rl.tasks import DigitTask
from plexrl.rl.tokenizers import CharTokenizer


def test_gae_by_hand():
    # row 0: gamma 0.9, lam 0.8 over tokens 1..3; row 1: a tool token at column 2 is skipped
    rewards = [[0, 0.1, -0.2, 1.0], [0, 0, 0, 1.0]]
    values = [[0, 0.5, 0.4, 0.3], [0, 0.2, 9.0, 0.6]]
    mask = [[0, 1, 1, 1], [0, 1, 0, 1]]
    adv, ret = gae(rewards[:1], values[:1], mask[:1], gamma=0.9, lam=0.8)
    # delta3 = 1 - .3 = .7; delta2 = -.2 + .9*.3 - .4 = -.33; delta1 = .1 + .9*.4 - .5 = -.04
    a3, a2 = 0.7, -0.33 + 0.72 * 0.7
    a1 = -0.04 + 0.72 * a2
    np.testing.assert_allclose(adv, [[0, a1, a2, a3]], atol=1e-12)
    np.testing.assert_allclose(ret, [[0, a1 + 0.5, a2 + 0.4, a3 + 0.3]], atol=1e-12)
    adv, ret = gae(rewards[1:], values[1:], mask[1:], gamma=1.0, lam=1.0)
    np.testing.assert_allclose(adv, [[0, 0.8, 0, 0.4]], atol=1e-12)   # 1 - V at each action
    np.testing.assert_allclose(ret, [[0, 1.0, 0, 1.0]], atol=1e-12)   # Monte Carlo return
    adv, _ = gae([[0, 0, 1.0]], [[0, 0.25, 0.5]], [[0, 1, 1]], gamma=1.0, lam=0.0)
    np.testing.assert_allclose(adv, [[0, 0.25, 0.5]])                 # lam 0: one-step TD


def test_token_rewards_put_the_score_on_the_last_sampled_token_and_kl_on_every_one():
    logprobs = np.array([[0, -1.0, -2.0, -0.5, 0], [0, -1.0, 0, 0, 0]])
    ref = np.array([[0, -1.5, -1.0, -0.5, 0], [0, -0.5, 0, 0, 0]])
    mask = np.array([[0, 1, 1, 1, 0], [0, 1, 0, 0, 0]])
    rewards = token_rewards([1.0, 0.0], logprobs, ref, mask, kl_coef=0.1)
    np.testing.assert_allclose(rewards, [[0, -0.05, 0.1, 1.0, 0], [0, 0.05, 0, 0, 0]])
    np.testing.assert_allclose(token_rewards([2.0], [[0, 0]], [[0, 0]], [[0, 0]], 0.1), [[0, 0]])


def test_whiten_and_the_value_layout():
    w = whiten([[9.0, 1.0, 3.0], [9.0, 5.0, 9.0]], [[0, 1, 1], [0, 1, 0]])
    np.testing.assert_allclose(w[[0, 0, 1], [1, 2, 1]], [-1.2247449, 0, 1.2247449], atol=1e-6)
    assert w[0, 0] == w[1, 0] == w[1, 2] == 0
    # the value of the state where token t is sampled is the value output at t - 1
    outputs = np.array([[10.0, 11.0, 12.0, 13.0, 14.0]])
    mask = np.array([[0, 0, 1, 1, 0]], dtype=np.float32)
    np.testing.assert_array_equal(shift_right(outputs) * mask, [[0, 0, 11, 12, 0]])
    batch = {"input_ids": np.zeros((1, 5)), "attention_mask": np.ones((1, 5)), "loss_mask": mask}
    vb = value_batch(batch, np.array([[0, 0, 0.5, 0.7, 0]]), outputs)
    np.testing.assert_array_equal(vb["loss_mask"], [[0, 1, 1, 0, 0]])
    np.testing.assert_allclose(vb["returns"], [[0, 0.5, 0.7, 0, 0]])
    np.testing.assert_array_equal(vb["old_values"], [[0, 11, 12, 0, 0]])


def test_config_validation():
    for bad in ({"epochs": 0}, {"clip": 0.0}, {"lam": 1.5}, {"value_clip": -1.0}):
        with pytest.raises(ConfigError):
            PPOConfig(**bad)


class FakeJob:
    """Answers every verb; a row is right when a fixed pseudo-random number of it is below
    ``skill``, which grows per policy OPTIM_STEP. Values are 0.5, logprobs -1 (ref -1.5)."""

    def __init__(self, tokenizer, gain=0.1):
        self.tok, self.gain, self.skill = tokenizer, gain, 0.1
        self.calls, self.batches, self.installed = [], [], 0

    def __call__(self, request):
        f, role = request.function, request.role
        self.calls.append((f, role))
        if f is Function.GENERATE:
            assert request.version == self.installed
            return self.generate(request)
        if f is Function.LOGPROBS:
            shape = np.asarray(request.payload["input_ids"]).shape
            if role is Role.VALUE:
                return {"values": np.full(shape, 0.5, dtype=np.float32)}
            return {"logprobs": np.full(shape, -1.5 if role is Role.REFERENCE else -1.0,
                                        dtype=np.float32)}
        if f is Function.FORWARD_BACKWARD:
            self.batches.append((role, request.payload, dict(request.options)))
            return {"loss": 0.0}
        if f is Function.OPTIM_STEP:
            self.skill += self.gain if role is Role.POLICY else 0.0
            return {}
        if f is Function.SYNC_WEIGHTS:
            self.installed = request.version
            return {"version": request.version}
        return {}

    def generate(self, request):
        prompts, n = request.payload["prompts"], request.max_tokens
        tokens = np.zeros((len(prompts), n), dtype=np.int64)
        lengths = np.zeros(len(prompts), dtype=np.int64)
        for i, prompt in enumerate(prompts):
            answer = self.tok.decode(prompt)[:-1]
            right = (i * 0.6180339) % 1.0 < self.skill
            ids = (self.tok.encode(answer if right else answer + "9", add_bos=False)
                   + [self.tok.eos_id])[:n]
            tokens[i, :len(ids)], lengths[i] = ids, len(ids)
        return {"tokens": tokens, "lengths": lengths, "stopped": lengths < n,
                "logprobs": -np.ones(tokens.shape, dtype=np.float32), "version": request.version}


def test_ppo_on_the_mock_transport_calls_each_model_in_order_and_reward_rises(tmp_path):
    task = DigitTask("copy", 2, 3)
    tok = CharTokenizer.for_tasks(task)
    fake = FakeJob(tok)
    job = plexrl.connect("mock", handler=fake).register_job("ppo", {"policy": None})
    freeze_reference(job, tmp_path)
    assert fake.calls == [(Function.SAVE, Role.POLICY), (Function.LOAD, Role.REFERENCE)]
    config = PPOConfig(prompts_per_step=10, max_tokens=6, epochs=2, kl_coef=0.1)
    records = train(job, task, tok, config, steps=4)
    verbs = fake.calls[2:2 + 11]
    assert verbs == [(Function.GENERATE, Role.POLICY), (Function.LOGPROBS, Role.POLICY),
                     (Function.LOGPROBS, Role.REFERENCE), (Function.LOGPROBS, Role.VALUE)] + [
        (Function.FORWARD_BACKWARD, Role.POLICY), (Function.FORWARD_BACKWARD, Role.VALUE),
        (Function.OPTIM_STEP, Role.POLICY), (Function.OPTIM_STEP, Role.VALUE)] + [
        (Function.FORWARD_BACKWARD, Role.POLICY), (Function.FORWARD_BACKWARD, Role.VALUE),
        (Function.OPTIM_STEP, Role.POLICY)]
    assert [r.version for r in records] == [2, 4, 6, 8]
    assert records[-1].reward_mean > records[0].reward_mean
    assert records[0].kl == pytest.approx(0.5)
    role, policy_batch, options = fake.batches[0]
    assert role is Role.POLICY and options["loss"] == "grpo"
    assert options["eps_low"] == options["eps_high"] == 0.2 and options["kl_coef"] == 0.0
    on = policy_batch["loss_mask"] > 0
    assert policy_batch["advantages"].shape == on.shape
    assert abs(policy_batch["advantages"][on].mean()) < 1e-5         # whitened
    assert not policy_batch["advantages"][~on].any()
    role, critic_batch, options = fake.batches[1]
    assert role is Role.VALUE and options == {"loss": "value", "clip": 0.2}
    np.testing.assert_array_equal(critic_batch["loss_mask"][:, :-1], policy_batch["loss_mask"][:, 1:])
    no_clip = FakeJob(tok)
    train(plexrl.connect("mock", handler=no_clip).register_job("ppo", {"policy": None}), task,
          tok, PPOConfig(prompts_per_step=2, value_clip=None, epochs=1), steps=1)
    assert no_clip.batches[1][2]["clip"] == float("inf")
