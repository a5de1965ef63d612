"""The demo's jobs: task, model, seed, warm-up and GRPO sizes; and the hash of that plan.

Owns: ``DemoJob``, ``demo_jobs(quick, scale)``, building each job's task and tokenizer, and
``config_hash`` (what a baseline record must match). Must not know: the runtime, threads,
timing or output files.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace

from plexrl.rl.grpo import GRPOConfig

CHAIN_SUM_ALPHABET = "+-0123456789="
HELDOUT = 200          #: held-out prompts of each greedy evaluation


@dataclass(frozen=True)
class DemoJob:
    name: str
    task: str                    #: "copy" / "reverse" / "add" (DigitTask) or "chain_sum"
    min_len: int
    max_len: int
    source: str                  #: built-in model config
    seed: int
    warmup_steps: int            #: supervised warm-up steps (stated cap)
    steps: int                   #: GRPO steps
    prompts_per_step: int
    group_size: int
    max_tokens: int
    lr: float = 1e-3
    warmup_lr: float = 3e-3

    def grpo(self) -> GRPOConfig:
        return GRPOConfig(prompts_per_step=self.prompts_per_step, group_size=self.group_size,
                          max_tokens=self.max_tokens, lr=self.lr, seed=self.seed)


FULL = (
    DemoJob("copy", "copy", 2, 3, "tiny-qwen2", seed=0, warmup_steps=30, steps=300,
            prompts_per_step=16, group_size=8, max_tokens=6),
    DemoJob("reverse", "reverse", 2, 3, "tiny-llama", seed=1, warmup_steps=40, steps=300,
            prompts_per_step=12, group_size=8, max_tokens=6),
    DemoJob("chain-sum", "chain_sum", 1, 2, "tiny-qwen2", seed=2, warmup_steps=300, steps=300,
            prompts_per_step=16, group_size=8, max_tokens=5),
)


def demo_jobs(quick: bool = False, scale: float = 1.0) -> tuple[DemoJob, ...]:
    """The full demo's jobs; ``quick``: a third of the GRPO steps, at most 60 warm-up steps;
    ``scale`` (hidden, tests)
    multiplies steps and warm-up steps (at least 2 each)."""
    jobs = FULL
    if quick:
        jobs = tuple(replace(j, steps=j.steps // 3, warmup_steps=min(j.warmup_steps, 60))
                     for j in jobs)
    if scale != 1.0:
        jobs = tuple(replace(j, steps=max(2, round(j.steps * scale)),
                             warmup_steps=max(2, round(j.warmup_steps * scale))) for j in jobs)
    return jobs


def make_task(job: DemoJob):
    """The job's task; reasoning-gym's chain_sum gets 2 terms and a compact prompt
    ("12+7=") so its alphabet fits a tiny model's vocabulary."""
    if job.task == "chain_sum":
        from plexrl.rl.tasks.gym import ReasoningGymTask
        return ReasoningGymTask("chain_sum", {"min_terms": 2, "max_terms": 2,
                                              "min_digits": job.min_len, "max_digits": job.max_len},
                                prompt=lambda e: e["metadata"]["expression"].replace(" ", "") + "=")
    from plexrl.rl.tasks import DigitTask
    return DigitTask(job.task, job.min_len, job.max_len)


def make_tokenizer(task):
    from plexrl.rl.tokenizers import CharTokenizer
    if hasattr(task, "fit_alphabet"):
        task.alphabet = CHAIN_SUM_ALPHABET     # what fit_alphabet finds, without its 5 s
    return CharTokenizer.for_tasks(task)


def config_hash(jobs) -> str:
    """blake2b of the jobs' fields (seeds included) and the held-out size."""
    text = json.dumps({"jobs": [asdict(j) for j in jobs], "heldout": HELDOUT}, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
