"""Reward functions called as TRL calls them: functions copied from TRL's documentation plug
in unchanged, None entries are skipped (TRL's NaN semantics), weights combine them."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import plexrl
from plexrl.errors import ConfigError
from plexrl.rl.grpo import GRPOConfig, train
from plexrl.rl.rewards import Rewards, TrainerState, verifier_reward
from plexrl.rl.tasks import DigitTask, Item
from plexrl.rl.tokenizers import CharTokenizer


# -- copied from TRL's GRPOTrainer documentation, unchanged ------------------------------
def reward_len(completions, **kwargs):
    return [-abs(20 - len(completion)) for completion in completions]


def format_reward_func(completions, **kwargs):
    """Reward function that checks if the completion has a specific format."""
    pattern = r"^<think>.*?</think><answer>.*?</answer>$"
    matches = [re.match(pattern, content) for content in completions]
    return [1.0 if match else 0.0 for match in matches]


def reward_func(completions, ground_truth, **kwargs):
    # Regular expression to capture content inside \boxed{}
    matches = [re.search(r"\\boxed\{(.*?)\}", completion) for completion in completions]
    contents = [match.group(1) if match else "" for match in matches]
    # Reward 1 if the content is the same as the ground truth, 0 otherwise
    return [1.0 if c == gt else 0.0 for c, gt in zip(contents, ground_truth)]
# -----------------------------------------------------------------------------------------


def _call(rewards, completions, **columns):
    return rewards.per_function(prompts=["p"] * len(completions), completions=completions,
                                completion_ids=[[3, 2]] * len(completions), columns=columns,
                                trainer_state=TrainerState(0, 1))


def test_trl_documentation_functions_plug_in_unchanged():
    rewards = Rewards([reward_len, format_reward_func, reward_func], weights=[0.1, 1.0, 2.0])
    completions = ["x" * 18, "<think>a</think><answer>b</answer>", "so \\boxed{42}"]
    per = _call(rewards, completions, ground_truth=["1", "2", "42"])
    np.testing.assert_allclose(per, [[-2, -(34 - 20), -(20 - 13)],
                                     [0, 1, 0], [0, 0, 1]])
    np.testing.assert_allclose(rewards.combine(per), [-0.2, -1.4 + 1.0, -0.7 + 2.0])


def test_every_keyword_reaches_the_function():
    seen = {}

    def spy(prompts, completions, completion_ids, trainer_state, answer, level, **kwargs):
        seen.update(prompts=prompts, ids=completion_ids, step=trainer_state.global_step,
                    answer=answer, level=level, extra=kwargs)
        return [0.0] * len(completions)
    rewards = Rewards([spy])
    rewards.per_function(prompts=["a", "b"], completions=["1", "2"],
                         completion_ids=[[4, 2], [5, 2]], trainer_state=TrainerState(7, 9),
                         columns={"answer": ["1", "3"], "level": [1, 2]})
    assert seen == {"prompts": ["a", "b"], "ids": [[4, 2], [5, 2]], "step": 7,
                    "answer": ["1", "3"], "level": [1, 2], "extra": {}}


def test_none_entries_are_skipped_as_in_trl():
    def only_even(completions, **kwargs):
        return [1.0 if i % 2 == 0 else None for i in range(len(completions))]

    def never(completions, **kwargs):
        return [None] * len(completions)
    rewards = Rewards([only_even, never, reward_len], weights=[2.0, 5.0, 0.0])
    per = _call(rewards, ["a", "b", "c"])
    assert np.isnan(per[0, 1]) and np.isnan(per[1]).all()
    np.testing.assert_allclose(rewards.combine(per), [2.0, 0.0, 2.0])
    means = rewards.means(per)
    assert means["only_even"] == 1.0 and math.isnan(means["never"])


def test_wrong_lengths_and_weights_are_config_errors():
    with pytest.raises(ConfigError):
        _call(Rewards([lambda completions, **kw: [1.0]]), ["a", "b"])
    with pytest.raises(ConfigError):
        Rewards([reward_len], weights=[1.0, 2.0])
    with pytest.raises(ConfigError):
        Rewards([])


def test_the_verifier_as_a_reward_function_rebuilds_items_from_columns():
    task = DigitTask("reverse", 2, 2)
    verifier = verifier_reward(task)
    assert verifier(prompts=["12>", "34>"], completions=["21", "34"], answer=["21", "43"],
                    completion_ids=[[], []], trainer_state=TrainerState(0, 1)) == [1.0, 0.0]


def test_a_trl_reward_function_drives_the_grpo_loop_on_the_mock_transport():
    task = DigitTask("copy", 2, 3)
    tok = CharTokenizer.for_tasks(task)
    lengths = [1, 6]

    def handler(request):
        if request.function.value == "generate":
            n = len(request.payload["prompts"])
            tokens = np.full((n, request.max_tokens), 3, dtype=np.int64)
            out_len = np.array([lengths[i % 2] for i in range(n)])
            return {"tokens": tokens, "lengths": out_len, "stopped": out_len < 6,
                    "logprobs": np.zeros(tokens.shape, np.float32), "version": 0}
        if request.function.value == "logprobs":
            return {"logprobs": np.zeros(np.shape(request.payload["input_ids"]), np.float32)}
        return {"version": request.version} if request.function.value == "sync_weights" else {}
    job = plexrl.connect("mock", handler=handler).register_job("rl", {"policy": None})
    records = train(job, task, tok, GRPOConfig(prompts_per_step=2, group_size=2, max_tokens=6),
                    steps=1, rewards=Rewards([reward_len, verifier_reward(task)]))
    # completions of 1 and 6 characters: reward_len -19 and -14, verifier 0
    assert records[0].rewards == {"reward_len": -16.5, "verifier_copy-2-3": 0.0}
    assert records[0].reward_mean == -16.5 and records[0].accuracy == 0.0
