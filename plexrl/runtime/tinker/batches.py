"""Tinker's loss inputs as a PlexRL batch: the data of a ``forward_backward``, padded.

Owns: which loss names are served and the ``loss_fn_inputs`` each reads (the SDK's names:
``target_tokens``, ``weights``, ``logprobs``, ``advantages``), checking every datum against
them (lengths, token range), and the batch the engine takes (``input_ids``,
``attention_mask``, ``target_tokens`` aligned as Tinker aligns them, ``loss_mask``,
``old_logprobs``, ``advantages``), right-padded to the longest datum. Tinker's losses are
sums over tokens, so every loss runs with ``num_tokens=1`` (docs/design.md D210); an RL
loss counts every token of a datum (the advantages say which matter), ``cross_entropy``
weights each by ``weights``.
Must not know: the wire format, jobs, torch.
"""

from __future__ import annotations

import numpy as np

from plexrl.runtime.tinker.futures import UserError
from plexrl.runtime.tinker.wire import Datum

_RL = ("target_tokens", "logprobs", "advantages")
#: served loss -> the loss_fn_inputs it needs
NEEDS = {"cross_entropy": ("target_tokens", "weights"), "importance_sampling": _RL,
         "ppo": _RL, "cispo": _RL}
#: loss_fn_config keys a loss takes (scalars)
CONFIG = {"ppo": ("clip_low_threshold", "clip_high_threshold"),
          "cispo": ("clip_low_threshold", "clip_high_threshold")}


def loss_args(loss_fn: str, config: dict[str, float]) -> dict:
    """The engine's keyword arguments for ``loss_fn`` with Tinker's ``loss_fn_config``."""
    if loss_fn not in NEEDS:
        raise UserError(f"loss_fn {loss_fn!r} is not served here; fix: use one of "
                        f"{sorted(NEEDS)}")
    allowed = CONFIG.get(loss_fn, ())
    unknown = sorted(set(config) - set(allowed))
    if unknown:
        raise UserError(f"loss_fn_config {unknown} is not taken by {loss_fn!r}; fix: "
                        f"pass only {list(allowed) or 'nothing'}")
    return {"num_tokens": 1.0, **config}


def batch_of(loss_fn: str, data: tuple[Datum, ...], vocab_size: int) -> dict[str, np.ndarray]:
    """The padded batch of ``data`` for ``loss_fn``; a datum that does not fit is a
    ``UserError`` naming it, its field and the fix."""
    if not data:
        raise UserError("forward_backward got no data; fix: pass at least one Datum")
    needs = NEEDS[loss_fn]
    for i, datum in enumerate(data):
        _check(i, datum, needs, vocab_size)
    rows, width = len(data), max(len(d.tokens) for d in data)
    batch = {"input_ids": np.zeros((rows, width), np.int64),
             "attention_mask": np.zeros((rows, width), np.int64),
             "target_tokens": np.zeros((rows, width), np.int64),
             "loss_mask": np.zeros((rows, width), np.float32)}
    if loss_fn != "cross_entropy":
        batch["old_logprobs"] = np.zeros((rows, width), np.float32)
        batch["advantages"] = np.zeros((rows, width), np.float32)
    for i, datum in enumerate(data):
        n = len(datum.tokens)
        batch["input_ids"][i, :n] = datum.tokens
        batch["attention_mask"][i, :n] = 1
        batch["target_tokens"][i, :n] = datum.inputs["target_tokens"].reshape(-1)
        if loss_fn == "cross_entropy":
            batch["loss_mask"][i, :n] = datum.inputs["weights"].reshape(-1)
        else:
            batch["loss_mask"][i, :n] = 1.0
            batch["old_logprobs"][i, :n] = datum.inputs["logprobs"].reshape(-1)
            batch["advantages"][i, :n] = datum.inputs["advantages"].reshape(-1)
    return batch


def _check(i: int, datum: Datum, needs: tuple[str, ...], vocab_size: int) -> None:
    n = len(datum.tokens)
    if n == 0:
        raise UserError(f"datum {i}: model_input has no tokens; fix: give every Datum a "
                        "non-empty ModelInput")
    missing = [k for k in needs if k not in datum.inputs]
    if missing:
        raise UserError(f"datum {i}: loss_fn_inputs lack {missing} (it has "
                        f"{sorted(datum.inputs)}); fix: pass {list(needs)}, one value per "
                        "model_input token")
    for key in needs:
        size = datum.inputs[key].size
        if size != n:
            raise UserError(f"datum {i}: loss_fn_inputs[{key!r}] has {size} values for "
                            f"{n} model_input tokens; fix: one value per token (position t "
                            "scores target_tokens[t])")
    for name, tokens in (("model_input", datum.tokens),
                         ("target_tokens", datum.inputs["target_tokens"])):
        bad = tokens[(tokens < 0) | (tokens >= vocab_size)]
        if bad.size:
            raise UserError(f"datum {i}: {name} has token {int(bad[0])} outside the "
                            f"model's vocabulary [0, {vocab_size}); fix: use the model's "
                            "tokenizer")
