"""A task source wrapping a named reasoning-gym dataset, scored by its own ``score_answer``.

Owns: drawing reasoning-gym entries into ``Item``s of one split, and scoring a completion
with the dataset's ``score_answer(answer, entry)``. reasoning-gym generates entry ``i`` of a
dataset from (seed, i), so a sample is reproducible; the split is the shared hash rule of
``base`` on the prompt text. ``prompt`` maps an entry to the text the model sees: the
dataset's ``question`` by default, or e.g. its bare expression for a tiny model; ``answer``
maps it to the reference text (the dataset's ``answer`` by default; e.g. lower-cased where the
scorer ignores case), which only a supervised warm-up reads: scores come from ``score_answer``. The entry
travels in the item's columns (``entry``), so a TRL-style reward function can score it too.
Must not know: tokenizers, the client, reward weighting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from plexrl.errors import ConfigError
from plexrl.rl.tasks.base import SPLITS, Item, Split, in_heldout


def question(entry: dict) -> str:
    return entry["question"]


def reference(entry: dict) -> str:
    return str(entry["answer"])


@dataclass
class ReasoningGymTask:
    """``dataset``: a reasoning-gym name (e.g. "chain_sum"); ``config``: its generator's
    options (e.g. ``{"min_digits": 1, "max_digits": 1}``)."""

    dataset: str
    config: dict = field(default_factory=dict)
    prompt: Callable[[dict], str] = question
    answer: Callable[[dict], str] = reference      #: the reference text warm-up trains on
    heldout_frac: float = 0.2
    alphabet: str = ""           #: set by ``fit_alphabet`` when a char tokenizer needs it

    def __post_init__(self):
        import reasoning_gym
        if self.dataset not in reasoning_gym.factory.DATASETS:
            raise ConfigError("unknown reasoning-gym dataset", field="dataset",
                              value=self.dataset, fix="see reasoning_gym.factory.DATASETS")
        self._scorer = reasoning_gym.create_dataset(self.dataset, size=1, seed=0, **self.config)

    @property
    def name(self) -> str:
        return f"rg-{self.dataset}"

    def sample(self, n: int, seed: int, split: Split = "train") -> list[Item]:
        import reasoning_gym
        if split not in SPLITS:
            raise ConfigError("unknown split", field="split", value=split)
        # reasoning-gym draws entry i from Random(seed + i): spread the seeds of different
        # calls far apart so their entries do not repeat shifted by one
        base = (seed * 2 * 2654435761 + SPLITS.index(split) * 1_000_003) % 2**31
        size = 200 * max(n, 1) + 1000
        items: list[Item] = []
        seen: set[str] = set()
        dataset = reasoning_gym.create_dataset(self.dataset, size=size, seed=base, **self.config)
        for entry in dataset:          # entries are generated lazily, one at a time
            text = self.prompt(entry)
            if in_heldout(text, self.heldout_frac) != (split == "heldout"):
                continue
            if split == "heldout" and text in seen:
                continue
            seen.add(text)
            items.append(Item(text, self.answer(entry), {"entry": entry}))
            if len(items) == n:
                return items
        raise ConfigError(f"found only {len(items)} of {n} {split} items", field="n", value=n,
                          fix="ask for fewer items or widen the dataset's config")

    def score(self, item: Item, completion: str) -> float:
        return float(self._scorer.score_answer(completion.strip(), item.columns["entry"]))

    def fit_alphabet(self, n: int = 2000, seed: int = 0) -> str:
        """Collect the characters of ``n`` items of each split into ``alphabet``."""
        chars = {c for split in SPLITS for item in self.sample(n, seed, split)
                 for c in item.prompt + item.answer}
        self.alphabet = "".join(sorted(chars))
        return self.alphabet
