"""What a verifiable task is: ``Item`` (prompt, answer, dataset columns), the ``Task``
protocol, and the held-out split every task shares.

Owns: the split rule. An item belongs to the held-out split when a keyed hash of its prompt
text falls in the held-out bucket (``heldout_frac`` of the hash space), so training and
held-out items never overlap whatever seeds draw them, and a held-out sample holds distinct
prompts. ``draw`` turns a generator of random items into a seeded sample of one split.
Must not know: tokenizers, models, the client, how rewards are combined.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable, Literal, Mapping, Protocol

import numpy as np

from plexrl.errors import ConfigError

Split = Literal["train", "heldout"]
SPLITS = ("train", "heldout")


@dataclass(frozen=True)
class Item:
    """One verifiable question. ``columns`` are the extra dataset columns a reward function
    receives by name (TRL passes every dataset column); ``answer`` is passed as one too."""

    prompt: str                  #: the text the model continues
    answer: str                  #: the reference answer, as text
    columns: Mapping[str, object] = field(default_factory=dict)


class Task(Protocol):
    """A source of verifiable items with an exact verifier."""

    name: str
    #: every character a prompt or answer may hold; "" when the alphabet is open (real
    #: tokenizers only)
    alphabet: str

    def sample(self, n: int, seed: int, split: Split = "train") -> list[Item]:
        """``n`` items of ``split`` drawn from ``seed`` (same seed, same items)."""
        ...

    def score(self, item: Item, completion: str) -> float:
        """1.0 for a right answer, 0.0 for a wrong one (a task may grade in between)."""
        ...


def in_heldout(prompt: str, heldout_frac: float) -> bool:
    """Whether ``prompt`` belongs to the held-out split (a keyed hash, stable across runs)."""
    digest = hashlib.blake2b(prompt.encode(), digest_size=8, person=b"plexrl-split").digest()
    return int.from_bytes(digest, "big") / 2.0**64 < heldout_frac


def draw(make: Callable[[np.random.Generator], Item], n: int, seed: int, split: Split,
         heldout_frac: float, *, max_tries_per_item: int = 200) -> list[Item]:
    """``n`` items of ``split`` from ``make(rng)``; held-out items are distinct prompts.

    Raises ConfigError when the item space is too small to hold ``n`` of them.
    """
    if split not in SPLITS:
        raise ConfigError("unknown split", field="split", value=split, fix=f"use one of {SPLITS}")
    rng = np.random.default_rng([seed, SPLITS.index(split)])
    items: list[Item] = []
    seen: set[str] = set()
    for _ in range(max(n, 1) * max_tries_per_item):
        if len(items) == n:
            return items
        item = make(rng)
        if in_heldout(item.prompt, heldout_frac) != (split == "heldout"):
            continue
        if split == "heldout" and item.prompt in seen:
            continue
        seen.add(item.prompt)
        items.append(item)
    if len(items) == n:
        return items
    raise ConfigError(f"found only {len(items)} of {n} {split} items", field="n", value=n,
                      fix="ask for fewer items or widen the task's item space")
