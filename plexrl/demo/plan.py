"""The demo's jobs: task, model, seed, warm-up and GRPO sizes, verifier latency; and the hash
of that plan.

Owns: ``DemoJob``, ``demo_jobs(quick, scale)``, building each job's task and tokenizer, and
``config_hash`` (what a baseline record must match). Must not know: the runtime, threads,
timing or output files.

The jobs (measured choices: docs/design.md): ``copy`` (own digit task, tiny-llama),
``reverse`` (own digit task, tiny-qwen2) and ``spell-backward`` (reasoning-gym's
``spell_backward``, 3-5 letter words, compact prompt ``"word>"``, scored by its own
``score_answer``; tiny-qwen2). Each declares ``verifier_s``: the round trip of its remote
verifier per GENERATE round (``plexrl.demo.verifier``), the same isolated and shared.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, replace

from plexrl.rl.grpo import GRPOConfig

CHAIN_SUM_ALPHABET = "+-0123456789="
SPELL_ALPHABET = "abcdefghijklmnopqrstuvwxyz>"
HELDOUT = 200          #: held-out prompts of each greedy evaluation
GYM_TASKS = ("chain_sum", "spell_backward")


@dataclass(frozen=True)
class DemoJob:
    name: str
    task: str                    #: "copy" / "reverse" / "add" (DigitTask), or a GYM_TASKS name
    min_len: int                 #: digits (digit tasks, chain_sum terms) or letters of a word
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
    verifier_s: float = 0.0      #: remote verifier round trip per GENERATE round, seconds

    def grpo(self) -> GRPOConfig:
        return GRPOConfig(prompts_per_step=self.prompts_per_step, group_size=self.group_size,
                          max_tokens=self.max_tokens, lr=self.lr, seed=self.seed)


FULL = (
    DemoJob("copy", "copy", 2, 3, "tiny-llama", seed=0, warmup_steps=30, steps=150,
            prompts_per_step=16, group_size=8, max_tokens=6, verifier_s=0.15),
    DemoJob("reverse", "reverse", 2, 3, "tiny-qwen2", seed=1, warmup_steps=60, steps=150,
            prompts_per_step=12, group_size=8, max_tokens=6, verifier_s=0.12),
    DemoJob("spell-backward", "spell_backward", 3, 5, "tiny-qwen2", seed=3, warmup_steps=60,
            steps=150, prompts_per_step=16, group_size=8, max_tokens=7, verifier_s=0.18),
)


def demo_jobs(quick: bool = False, scale: float = 1.0) -> tuple[DemoJob, ...]:
    """The full demo's jobs; ``quick``: a fifth of the GRPO steps, at most 30 warm-up
    steps; ``scale`` (hidden, tests) multiplies steps and warm-up steps (at least 2 each)."""
    jobs = FULL
    if quick:
        jobs = tuple(replace(j, steps=j.steps // 5, warmup_steps=min(j.warmup_steps, 30))
                     for j in jobs)
    if scale != 1.0:
        jobs = tuple(replace(j, steps=max(2, round(j.steps * scale)),
                             warmup_steps=max(2, round(j.warmup_steps * scale))) for j in jobs)
    return jobs


def make_task(job: DemoJob):
    """The job's task. reasoning-gym tasks get a compact prompt so their alphabet fits a tiny
    model's vocabulary: chain_sum ``"12+7="`` (2 terms), spell_backward ``"word>"``
    lower-cased (its scorer ignores case), reference answers lower-cased to match."""
    from plexrl.rl.tasks.gym import ReasoningGymTask
    if job.task == "chain_sum":
        return ReasoningGymTask("chain_sum", {"min_terms": 2, "max_terms": 2,
                                              "min_digits": job.min_len, "max_digits": job.max_len},
                                prompt=lambda e: e["metadata"]["expression"].replace(" ", "") + "=")
    if job.task == "spell_backward":
        return ReasoningGymTask("spell_backward", {"min_word_len": job.min_len,
                                                   "max_word_len": job.max_len},
                                prompt=lambda e: e["metadata"]["word"].lower() + ">",
                                answer=lambda e: str(e["answer"]).lower())
    from plexrl.rl.tasks import DigitTask
    return DigitTask(job.task, job.min_len, job.max_len)


def make_tokenizer(task):
    """A CharTokenizer of the task's alphabet; a reasoning-gym task gets its known compact
    alphabet (what ``fit_alphabet`` finds, without its seconds)."""
    from plexrl.rl.tokenizers import CharTokenizer
    if hasattr(task, "fit_alphabet"):
        task.alphabet = {"chain_sum": CHAIN_SUM_ALPHABET,
                         "spell_backward": SPELL_ALPHABET}[task.dataset]
    return CharTokenizer.for_tasks(task)


def config_hash(jobs) -> str:
    """blake2b of the jobs' fields (seeds and verifier latencies included) and the held-out
    size."""
    text = json.dumps({"jobs": [asdict(j) for j in jobs], "heldout": HELDOUT}, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()
