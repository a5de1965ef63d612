"""Own generators for tiny models: copy a digit string, reverse it, add two numbers.

Owns: three tasks whose prompts and answers use a 13-character alphabet
(``0123456789=>+``), so a character-level vocabulary fits the 64 ids of the tiny model
configs, and whose items a 80K-parameter model can learn. Prompt formats: copy ``"123="``
-> ``"123"``; reverse ``"123>"`` -> ``"321"``; add ``"12+7="`` -> ``"19"``. The verifier is
exact: the completion, stripped of surrounding whitespace, must equal the answer.
Must not know: tokenizers, the client, reward weighting.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from plexrl.errors import ConfigError
from plexrl.rl.tasks.base import Item, Split, draw

ALPHABET = "0123456789=>+"


def exact_match(answer: str, completion: str) -> float:
    """1.0 when ``completion`` is ``answer`` up to surrounding whitespace, else 0.0."""
    return 1.0 if completion.strip() == answer else 0.0


def _digits(rng: np.random.Generator, min_len: int, max_len: int) -> str:
    length = int(rng.integers(min_len, max_len + 1))
    return "".join(str(d) for d in rng.integers(0, 10, size=length))


@dataclass(frozen=True)
class DigitTask:
    """A digit-string task; ``kind`` is "copy", "reverse" or "add".

    ``min_len``/``max_len``: digits of the string (copy, reverse) or of each addend (add).
    """

    kind: str = "reverse"
    min_len: int = 2
    max_len: int = 4
    heldout_frac: float = 0.2
    alphabet: str = ALPHABET

    def __post_init__(self):
        if self.kind not in ("copy", "reverse", "add"):
            raise ConfigError("unknown digit task", field="kind", value=self.kind,
                              fix="use copy, reverse or add")
        if not 1 <= self.min_len <= self.max_len:
            raise ConfigError("need 1 <= min_len <= max_len", field="max_len",
                              value=(self.min_len, self.max_len))

    @property
    def name(self) -> str:
        return f"{self.kind}-{self.min_len}-{self.max_len}"

    def make(self, rng: np.random.Generator) -> Item:
        """One random item (either split)."""
        if self.kind == "add":
            a, b = _digits(rng, self.min_len, self.max_len), _digits(rng, self.min_len,
                                                                      self.max_len)
            a, b = str(int(a)), str(int(b))
            return Item(f"{a}+{b}=", str(int(a) + int(b)))
        s = _digits(rng, self.min_len, self.max_len)
        if self.kind == "copy":
            return Item(f"{s}=", s)
        return Item(f"{s}>", s[::-1])

    def sample(self, n: int, seed: int, split: Split = "train") -> list[Item]:
        return draw(self.make, n, seed, split, self.heldout_frac)

    def score(self, item: Item, completion: str) -> float:
        return exact_match(item.answer, completion)
