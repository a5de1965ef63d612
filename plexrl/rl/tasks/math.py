"""Math word problems from JSONL, with answers marked by ``\\boxed{}`` or ``####``.

Owns: the loader (one JSON object a line: ``question`` or ``problem``, and ``answer`` or
``solution`` holding the worked answer), answer extraction (the last ``\\boxed{...}`` with
balanced braces, else what follows the last ``####`` on its line), normalisation, and the
verifier. The verifier is strict: a completion whose answer is not marked scores 0 (no
"last number in the text" guessing); marked answers equal when both read as exact rationals
(ASCII digits only, compared as ``Fraction``, so huge numbers never round) or as the same
normalised text. Must not know: tokenizers, the client, reward weighting.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import numpy as np

from plexrl.errors import ConfigError
from plexrl.rl.tasks.base import Item, Split, in_heldout

SAMPLE = Path(__file__).resolve().parents[1] / "data" / "math-sample.jsonl"
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", re.ASCII)
_FRAC = re.compile(r"([+-]?)\\frac\{([^{}]+)\}\{([^{}]+)\}", re.ASCII)
_MAX_NUMBER_CHARS = 4000


def extract_answer(text: str) -> str | None:
    """The marked answer of ``text``: the last ``\\boxed{}``, else the last ``####`` line."""
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    if "####" in text:
        return text.rsplit("####", 1)[1].strip().split("\n", 1)[0].strip()
    return None


def _last_boxed(text: str) -> str | None:
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1:j]
    return None   # unbalanced: no answer


def normalise(answer: str) -> str:
    """Drop what does not change a math answer: spacing, ``$``, thousands commas, ``\\left``."""
    text = answer.strip().strip("$").strip()
    for old, new in (("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\left", ""),
                     ("\\right", ""), ("\\!", ""), ("\\,", ""), (" ", "")):
        text = text.replace(old, new)
    text = re.sub(r"(?<=\d),(?=\d{3}\b)", "", text, flags=re.ASCII)
    return text.rstrip(".")


def as_number(answer: str) -> Fraction | None:
    """``answer`` as an exact rational (integers, decimals, a/b, \\frac{a}{b}), else None."""
    text = normalise(answer)
    if len(text) > _MAX_NUMBER_CHARS:
        return None
    frac = _FRAC.fullmatch(text)
    if frac:
        sign, num, den = frac.groups()
        text = f"{sign}{num}/{den}"
    parts = text.split("/")
    if len(parts) > 2 or not all(_NUMBER.fullmatch(p) for p in parts):
        return None
    try:
        value = Fraction(parts[0])
        return value / Fraction(parts[1]) if len(parts) == 2 else value
    except (ValueError, ZeroDivisionError):
        return None


def answers_equal(reference: str, candidate: str | None) -> bool:
    if candidate is None or not candidate.strip():
        return False
    a, b = as_number(reference), as_number(candidate)
    if a is not None or b is not None:
        return a == b
    return normalise(reference) == normalise(candidate)


def load_jsonl(path: str | Path) -> list[Item]:
    """Every line of ``path`` as an Item; a line without a marked answer is a ConfigError."""
    items = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        prompt = row.get("question", row.get("problem"))
        worked = str(row.get("answer", row.get("solution", "")))
        answer = extract_answer(worked)
        if prompt is None or answer is None:
            raise ConfigError("a row needs a question and a marked answer", file=str(path),
                              field=f"line {number}", fix="question/problem + answer/solution "
                              "with \\boxed{} or ####")
        items.append(Item(prompt, answer, {"solution": worked}))
    return items


@dataclass
class MathTask:
    """Items of a JSONL file (the shipped sample by default); ``score`` is strict."""

    path: str | Path = SAMPLE
    heldout_frac: float = 0.2
    alphabet: str = ""

    def __post_init__(self):
        self.items = load_jsonl(self.path)
        self.name = f"math-{Path(self.path).stem}"

    def sample(self, n: int, seed: int, split: Split = "train") -> list[Item]:
        """Training items are drawn with replacement; held-out items are distinct."""
        pool = [it for it in self.items if in_heldout(it.prompt, self.heldout_frac)
                == (split == "heldout")]
        if not pool or (split == "heldout" and n > len(pool)):
            raise ConfigError(f"the {split} split holds {len(pool)} items", field="n", value=n)
        rng = np.random.default_rng([seed, split == "heldout"])
        picks = (rng.permutation(len(pool))[:n] if split == "heldout"
                 else rng.integers(0, len(pool), size=n))
        return [pool[int(i)] for i in picks]

    def score(self, item: Item, completion: str) -> float:
        return 1.0 if answers_equal(item.answer, extract_answer(completion)) else 0.0
