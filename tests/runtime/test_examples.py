"""The README's "run your own job" example runs and learns."""

from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).parents[2] / "examples" / "own_job.py"


def test_the_own_job_example_trains_and_its_reward_rises(ray_session):
    spec = importlib.util.spec_from_file_location("own_job", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    rewards = example.main(steps=15, seed=0)
    assert len(rewards) == 15
    assert sum(rewards[-5:]) / 5 > sum(rewards[:5]) / 5 + 0.05
