"""Text <-> token ids for a job: a character-level tokenizer for tiny models, and a wrapper
for a Hugging Face tokenizer stored on local disk.

Owns: ``Tokenizer`` (the protocol a training loop needs: ``encode``, ``decode``, the
pad/bos/eos ids and ``vocab_size``), ``CharTokenizer`` (ids 0 pad, 1 bos, 2 eos, as the tiny
model configs have them, then one id per character of the task alphabet) and
``HFTokenizer`` (reads ``tokenizer.json`` with the ``tokenizers`` library from a local
directory; never downloads, never imports transformers or torch).
Must not know: models, the client, tasks (beyond the alphabet they hand in).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Protocol, Sequence

from plexrl.errors import ConfigError

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2
UNKNOWN = "\ufffd"   #: what ``decode`` writes for an id outside the vocabulary


class Tokenizer(Protocol):
    pad_id: int
    bos_id: int
    eos_id: int
    vocab_size: int

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` up to the first eos; special ids are dropped."""
        ...


class CharTokenizer:
    """One id per character of ``alphabet`` after the three special ids."""

    pad_id, bos_id, eos_id = PAD_ID, BOS_ID, EOS_ID

    def __init__(self, alphabet: str):
        chars = sorted(set(alphabet))
        if not chars:
            raise ConfigError("a char tokenizer needs an alphabet", field="alphabet",
                              fix="use the task's alphabet (ReasoningGymTask.fit_alphabet)")
        self.alphabet = "".join(chars)
        self._ids = {c: i + 3 for i, c in enumerate(chars)}
        self.vocab_size = 3 + len(chars)

    @classmethod
    def for_tasks(cls, *tasks) -> "CharTokenizer":
        """The tokenizer of the union of the tasks' alphabets."""
        return cls("".join(t.alphabet for t in tasks))

    def check_fits(self, model_vocab_size: int) -> None:
        """ConfigError unless every id is below ``model_vocab_size``."""
        if self.vocab_size > model_vocab_size:
            raise ConfigError(f"{self.vocab_size} token ids do not fit the model's "
                              f"{model_vocab_size}", field="alphabet", value=self.alphabet,
                              fix="a smaller alphabet or a model with a larger vocabulary")

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]:
        try:
            ids = [self._ids[c] for c in text]
        except KeyError as err:
            raise ConfigError("a character outside the tokenizer's alphabet", field="text",
                              value=err.args[0], fix="build the tokenizer from this task") from None
        return [self.bos_id, *ids] if add_bos else ids

    def decode(self, ids: Sequence[int]) -> str:
        out = []
        for i in map(int, ids):
            if i == self.eos_id:
                break
            if i in (self.pad_id, self.bos_id):
                continue
            out.append(self.alphabet[i - 3] if 3 <= i < self.vocab_size else UNKNOWN)
        return "".join(out)


class HFTokenizer:
    """A Hugging Face tokenizer from a local directory holding ``tokenizer.json``.

    Special ids come from ``tokenizer_config.json`` (``bos_token``, ``eos_token``,
    ``pad_token``) or ``config.json`` (``*_token_id``); a missing pad falls back to eos.
    """

    def __init__(self, path: str | Path):
        from tokenizers import Tokenizer as RustTokenizer
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        root = Path(path)
        if not (root / "tokenizer.json").is_file():
            raise ConfigError("no tokenizer.json in this directory (tokenizers are never "
                              "downloaded)", field="path", value=str(path),
                              fix="a local checkpoint directory")
        self._tok = RustTokenizer.from_file(str(root / "tokenizer.json"))
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        ids = {**self._ids_of(_read(root / "config.json"), "{}_token_id"),
               **self._ids_of(_read(root / "tokenizer_config.json"), "{}_token")}
        if "eos" not in ids:
            raise ConfigError("the tokenizer names no eos token", field="path", value=str(path))
        self.eos_id = ids["eos"]
        self.bos_id = ids.get("bos")
        self.pad_id = ids.get("pad", self.eos_id)

    def _ids_of(self, config: dict, pattern: str) -> dict[str, int]:
        out = {}
        for name in ("bos", "eos", "pad"):
            value = config.get(pattern.format(name))
            if isinstance(value, dict):          # {"content": "<s>", ...}
                value = value.get("content")
            if isinstance(value, str):
                value = self._tok.token_to_id(value)
            if isinstance(value, int):
                out[name] = value
        return out

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        return [self.bos_id, *ids] if add_bos and self.bos_id is not None else list(ids)

    def decode(self, ids: Sequence[int]) -> str:
        ids = [int(i) for i in ids]
        if self.eos_id in ids:
            ids = ids[:ids.index(self.eos_id)]
        return self._tok.decode(ids, skip_special_tokens=True)


def _read(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}
