"""GRPO / DAPO pieces against hand-computed values, and the loop end to end on a mock
transport whose handler fakes a model that gets better with every OPTIM_STEP."""

from __future__ import annotations

import math

import numpy as np
import pytest

import plexrl
from plexrl.errors import ConfigError
from plexrl.protocol import Function, Role
from plexrl.rl.grpo import (GRPOConfig, build_batch, greedy_accuracy, group_advantages,
                            keep_groups, overlong_penalty, train)
from plexrl.rl.tasks import DigitTask
from plexrl.rl.tokenizers import CharTokenizer


def test_group_advantages_by_hand():
    # group [1, 0]: mean 0.5, sample std sqrt(0.5); group [3, 3, 3, 3] would be all zero
    adv = group_advantages([1.0, 0.0, 0.0, 1.0], 2)
    expected = 0.5 / (math.sqrt(0.5) + 1e-6)
    np.testing.assert_allclose(adv, [expected, -expected, -expected, expected], rtol=1e-6)
    np.testing.assert_allclose(group_advantages([1.0, 0.0, 2.0, 2.0], 2, scale=False),
                               [0.5, -0.5, 0.0, 0.0])
    # group of three [0, 1, 2]: mean 1, std 1 -> [-1, 0, 1]
    np.testing.assert_allclose(group_advantages([0.0, 1.0, 2.0], 3), [-1, 0, 1], atol=1e-5)
    np.testing.assert_array_equal(group_advantages([2.0, 2.0, 2.0], 3), [0, 0, 0])


def test_overlong_penalty_by_hand():
    # max 10, buffer 4: no penalty up to 6 tokens, then linear to -penalty at 10
    np.testing.assert_allclose(overlong_penalty([3, 6, 7, 8, 10], 10, 4, 1.0),
                               [0, 0, -0.25, -0.5, -1.0])
    np.testing.assert_allclose(overlong_penalty([8, 10], 10, 4, 0.5), [-0.25, -0.5])
    np.testing.assert_array_equal(overlong_penalty([10, 10], 10, 0, 1.0), [0, 0])


def test_dynamic_sampling_keeps_only_groups_with_different_rewards():
    np.testing.assert_array_equal(keep_groups([1, 1, 0, 1, 0, 0, 0.5, 0.5], 2),
                                  [False, True, False, False])


def test_build_batch_aligns_completion_and_sampler_logprobs():
    gen = {"tokens": np.array([[7, 2, 0], [8, 9, 2]]), "lengths": np.array([2, 3]),
           "logprobs": np.array([[-0.1, -0.2, 0.0], [-0.3, -0.4, -0.5]], dtype=np.float32)}
    batch = build_batch([[1, 5], [1]], gen, pad_id=0)
    np.testing.assert_array_equal(batch["input_ids"], [[1, 5, 7, 2], [1, 8, 9, 2]])
    np.testing.assert_array_equal(batch["attention_mask"], [[1, 1, 1, 1], [1, 1, 1, 1]])
    np.testing.assert_array_equal(batch["loss_mask"], [[0, 0, 1, 1], [0, 1, 1, 1]])
    np.testing.assert_allclose(batch["old_logprobs"], [[0, 0, -0.1, -0.2], [0, -0.3, -0.4, -0.5]])
    short = build_batch([[1, 5, 6], [1]], {**gen, "lengths": np.array([1, 1])}, pad_id=0)
    np.testing.assert_array_equal(short["input_ids"], [[1, 5, 6, 7], [1, 8, 0, 0]])
    np.testing.assert_array_equal(short["attention_mask"], [[1, 1, 1, 1], [1, 1, 0, 0]])


def test_config_dapo_preset_and_validation():
    dapo = GRPOConfig.dapo(max_tokens=16)
    assert (dapo.eps_high, dapo.dynamic_sampling, dapo.kl_coef, dapo.overlong_buffer) == (
        0.28, True, 0.0, 4)
    assert GRPOConfig.dapo(max_tokens=16, overlong_buffer=2).overlong_buffer == 2
    for bad in ({"group_size": 1}, {"temperature": 0.0}, {"overlong_buffer": 99},
                {"eps_low": 1.0}):
        with pytest.raises(ConfigError):
            GRPOConfig(**bad)


# -- end to end on the mock transport --------------------------------------------------

class FakeModel:
    """Answers every verb deterministically. Its ``skill`` grows by ``gain`` per OPTIM_STEP;
    a row is answered right when a fixed pseudo-random number of the row is below skill."""

    def __init__(self, task, tokenizer, gain=0.1, skill=0.2):
        self.task, self.tok, self.gain, self.skill = task, tokenizer, gain, skill
        self.calls, self.batches, self.installed = [], [], 0

    def __call__(self, request):
        self.calls.append((request.function, request.role, request.version))
        if request.function is Function.GENERATE:
            assert request.version <= self.installed, "sampled a version never installed"
            return self.generate(request)
        if request.function is Function.LOGPROBS:
            ids = np.asarray(request.payload["input_ids"])
            return {"logprobs": np.full(ids.shape, -1.0, dtype=np.float32)}
        if request.function is Function.FORWARD_BACKWARD:
            self.batches.append((request.payload, dict(request.options)))
            return {"loss": 0.0, "num_tokens": float(np.sum(request.payload["loss_mask"]))}
        if request.function is Function.OPTIM_STEP:
            self.skill = min(1.0, self.skill + self.gain)
            return {}
        if request.function is Function.SYNC_WEIGHTS:
            self.installed = request.version
            return {"version": request.version}
        raise AssertionError(request.function)

    def generate(self, request):
        prompts, max_tokens = request.payload["prompts"], request.max_tokens
        tokens = np.zeros((len(prompts), max_tokens), dtype=np.int64)
        lengths = np.zeros(len(prompts), dtype=np.int64)
        for i, prompt in enumerate(prompts):
            text = self.tok.decode(prompt)
            answer = text[:-1] if text.endswith("=") else text[-2::-1]
            right = (i * 0.6180339 + request.step * 0.1) % 1.0 < self.skill
            ids = self.tok.encode(answer if right else answer + "9", add_bos=False)
            ids = (ids + [self.tok.eos_id])[:max_tokens]
            tokens[i, :len(ids)], lengths[i] = ids, len(ids)
        return {"tokens": tokens, "lengths": lengths, "stopped": lengths < max_tokens,
                "logprobs": -np.ones(tokens.shape, dtype=np.float32), "version": request.version}


def _mock_job(fake, **register):
    runtime = plexrl.connect("mock", handler=fake)
    return runtime.register_job("rl", {"policy": None}, **register)


def test_grpo_on_the_mock_transport_calls_the_verbs_in_order_and_reward_rises():
    task = DigitTask("copy", 2, 3)
    tok = CharTokenizer.for_tasks(task)
    fake = FakeModel(task, tok)
    job = _mock_job(fake)
    config = GRPOConfig(prompts_per_step=4, group_size=4, max_tokens=6)
    records = train(job, task, tok, config, steps=6)
    rewards = [r.reward_mean for r in records]
    print("mock rewards", rewards)
    assert np.mean(rewards[-2:]) > np.mean(rewards[:2]) + 0.3
    assert [r.version for r in records] == [1, 2, 3, 4, 5, 6]
    verbs = [f for f, _, _ in fake.calls]
    assert verbs[:5] == [Function.GENERATE, Function.LOGPROBS, Function.FORWARD_BACKWARD,
                         Function.OPTIM_STEP, Function.SYNC_WEIGHTS]
    assert [v for f, _, v in fake.calls if f is Function.GENERATE] == [0, 1, 2, 3, 4, 5]
    batch, options = fake.batches[0]
    assert options["loss"] == "grpo" and options["eps_high"] == 0.28
    np.testing.assert_array_equal(batch["old_logprobs"][batch["loss_mask"] > 0], -1.0)
    assert batch["advantages"].shape == (16,)
    np.testing.assert_allclose(batch["advantages"].reshape(4, 4).sum(1), 0, atol=1e-5)
    held = task.sample(20, 0, "heldout")
    expected = np.mean([(i * 0.6180339 + 0.6) % 1.0 < fake.skill for i in range(20)])
    assert greedy_accuracy(job, task, tok, held, version=6, max_tokens=6) == expected


def test_dapo_dynamic_sampling_drops_uniform_groups_and_skips_empty_steps():
    task = DigitTask("copy", 2, 3)
    tok = CharTokenizer.for_tasks(task)
    never = FakeModel(task, tok, gain=0.0, skill=0.0)    # every group all wrong
    job = _mock_job(never)
    config = GRPOConfig.dapo(prompts_per_step=2, group_size=4, max_tokens=6, max_resamples=1)
    records = train(job, task, tok, config, steps=3)
    assert [(r.kept_groups, r.num_groups, r.version) for r in records] == [(0, 4, 0)] * 3
    assert Function.FORWARD_BACKWARD not in [f for f, _, _ in never.calls]
    mixed = FakeModel(task, tok, gain=0.0, skill=0.5)
    records = train(_mock_job(mixed), task, tok, config, steps=2)
    for record, (batch, _) in zip(records, mixed.batches):
        assert batch["input_ids"].shape[0] == record.kept_groups * 4
        assert 1 <= record.kept_groups <= 2


def test_kl_asks_the_reference_model_for_logprobs():
    task = DigitTask("copy", 2, 3)
    tok = CharTokenizer.for_tasks(task)
    fake = FakeModel(task, tok)
    train(_mock_job(fake), task, tok,
          GRPOConfig(prompts_per_step=2, group_size=2, max_tokens=6, kl_coef=0.05), steps=1)
    assert (Function.LOGPROBS, Role.REFERENCE, 0) in fake.calls
    batch, options = fake.batches[0]
    assert "ref_logprobs" in batch and options["kl_coef"] == 0.05


def test_overlong_penalty_enters_the_reward():
    task = DigitTask("copy", 2, 3)
    tok = CharTokenizer.for_tasks(task)
    fake = FakeModel(task, tok, gain=0.0, skill=1.0)     # always right, 3-4 tokens + eos
    config = GRPOConfig(prompts_per_step=4, group_size=2, max_tokens=5, overlong_buffer=2)
    record = train(_mock_job(fake), task, tok, config, steps=1)[0]
    assert record.accuracy == 1.0
    assert record.reward_mean < 1.0         # answers of 4 tokens + eos are penalised
