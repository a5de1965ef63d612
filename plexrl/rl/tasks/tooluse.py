"""Arithmetic a tiny model cannot do in its head but can with a calculator: a tool-use task.

Owns: ``ToolArithTask`` (``"37*58="`` -> ``"2146"``), ``final_answer`` (the text after the
last tool result, so ``"[37*58]{2146}2146"`` answers ``2146``), the exact verifier on it,
``transcript`` (the ideal completion, tool call and result included) and ``TranscriptTask``
(the task with transcripts as answers, for a supervised warm-up). The alphabet holds the
call and result brackets and the letters of every tool result kind, so what
``ToolBox.render`` writes always encodes.
Must not know: tokenizers, the client, how tools run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from plexrl.errors import ConfigError
from plexrl.rl.tasks.base import Item, Split, draw
from plexrl.rl.tools import KINDS

OPS = "+-*"
ALPHABET = "0123456789+-*/=.[]{}" + "".join(sorted(set("".join(KINDS))))


def final_answer(completion: str, result_close: str = "}") -> str:
    """What follows the last tool result (the whole completion when there is none)."""
    return completion.rsplit(result_close, 1)[-1].strip()


@dataclass(frozen=True)
class ToolArithTask:
    """``a <op> b =`` with ``min_len..max_len``-digit operands; ``ops`` a subset of + - *."""

    min_len: int = 2
    max_len: int = 2
    ops: str = "*"
    heldout_frac: float = 0.2
    alphabet: str = ALPHABET

    def __post_init__(self):
        if not self.ops or set(self.ops) - set(OPS) or not 1 <= self.min_len <= self.max_len:
            raise ConfigError("need ops from '+-*' and 1 <= min_len <= max_len",
                              field="ops", value=(self.ops, self.min_len, self.max_len))

    @property
    def name(self) -> str:
        return f"tool-arith-{self.ops}-{self.min_len}-{self.max_len}"

    def make(self, rng: np.random.Generator) -> Item:
        a, b = (int(rng.integers(10 ** (self.min_len - 1), 10 ** self.max_len))
                for _ in range(2))
        op = self.ops[int(rng.integers(len(self.ops)))]
        value = {"+": a + b, "-": a - b, "*": a * b}[op]
        return Item(f"{a}{op}{b}=", str(value))

    def sample(self, n: int, seed: int, split: Split = "train") -> list[Item]:
        return draw(self.make, n, seed, split, self.heldout_frac)

    def score(self, item: Item, completion: str) -> float:
        return 1.0 if final_answer(completion) == item.answer else 0.0

    def transcript(self, item: Item) -> str:
        """The ideal completion: call the calculator, read its result, write it out."""
        return f"[{item.prompt[:-1]}]{{{item.answer}}}{item.answer}"


@dataclass(frozen=True)
class TranscriptTask:
    """``task`` with each item's answer replaced by its ideal tool-using transcript: what a
    supervised warm-up (``plexrl.rl.sft``) teaches before RL. The loss then covers the tool
    result too (the warm-up cannot mask it); GENERATE stops at the call, so the model never
    has to write a result itself."""

    task: ToolArithTask

    @property
    def alphabet(self) -> str:
        return self.task.alphabet

    @property
    def name(self) -> str:
        return f"{self.task.name}-transcripts"

    def sample(self, n: int, seed: int, split: Split = "train") -> list[Item]:
        return [Item(it.prompt, self.task.transcript(it)) for it in self.task.sample(n, seed, split)]

    def score(self, item: Item, completion: str) -> float:
        return 1.0 if completion.strip() == item.answer else 0.0
