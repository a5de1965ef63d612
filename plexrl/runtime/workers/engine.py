"""The PyTorch engine: one model's calls run on flat buffers that someone else owns.

Owns: running GENERATE, LOGPROBS (``values`` for a value head), FORWARD_BACKWARD and
OPTIM_STEP of one Hugging Face module on flat fp32 buffers (weights, grads, optimizer) handed in with each call, and
the sizes of what a call needs besides those buffers (KV cache, activations). Must not know
where the buffers live between calls, which tier they sit on, or who else runs on this
worker group: the ``StateStore`` owns the buffers and may hand in different storage on every
call. Does not set torch's thread count (the service does).

How it departs from a textbook training loop:

- The module holds no weights. Its parameters are meta tensors; each call binds views into
  the flat ``weights`` buffer in their place and puts the meta tensors back on return, so
  moving a buffer between calls cannot leave a stale copy behind (and one Engine runs one
  call at a time).
- Gradients are taken with ``torch.autograd.grad`` on leaf views of ``weights`` and added
  into the flat ``grads`` buffer: a call accumulates, OPTIM_STEP zeroes.
- AdamW runs on the flat buffers with the arithmetic of ``torch.optim.AdamW``'s single-tensor
  path, op for op, so it matches it bit for bit. The optimizer buffer is laid out as
  ``[exp_avg (numel) | exp_avg_sq (numel) | step (1)]``.
- Sampling is seeded per sequence: a GENERATE draws one uniform per (sequence, token) from
  the caller's ``torch.Generator`` up front and samples each token by inverting its row's
  CDF, so a sequence's tokens do not depend on which rows share its batch (a group of n
  ranks samples its slice of the rows, and gets the tokens one device would). The logprobs
  it reports are under ``softmax(logits / temperature)`` before top-p truncation, the
  distribution ``logprobs`` computes. Temperature 0 is greedy and reports logprobs at
  temperature 1.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from plexrl.errors import ConfigError
from plexrl.losses import get_loss
from plexrl.protocol import ModelSpec
from plexrl.runtime.models import build_module

_FP32 = 4


@dataclass(frozen=True)
class Slot:
    """Where one parameter lives in the flat weights buffer (elements, not bytes)."""

    name: str
    shape: tuple[int, ...]
    offset: int
    numel: int


def _layout(module: torch.nn.Module, include=None) -> tuple[Slot, ...]:
    """The parameters of ``module`` (those whose name ``include`` takes) in registration
    order, tied ones once."""
    slots, offset = [], 0
    for name, param in module.named_parameters():
        if include is not None and not include(name):
            continue
        slots.append(Slot(name, tuple(param.shape), offset, param.numel()))
        offset += param.numel()
    return tuple(slots)


def _flatten(module: torch.nn.Module, layout: tuple[Slot, ...]) -> torch.Tensor:
    params = dict(module.named_parameters())
    return torch.cat([params[s.name].detach().reshape(-1) for s in layout]).float()


@dataclass(frozen=True)
class _Binding:
    """One parameter attribute of the module: where it sits and which Slot fills it."""

    owner: torch.nn.Module
    leaf: str
    slot: str                    #: a tied attribute names the Slot of its first occurrence
    meta: torch.nn.Parameter     #: what it holds between calls


def _strip_weights(module: torch.nn.Module) -> tuple[_Binding, ...]:
    """Replace every parameter by a meta tensor of its shape (memory freed), ties kept."""
    first: dict[int, tuple[str, torch.nn.Parameter]] = {}
    bindings = []
    for name, param in list(module.named_parameters(remove_duplicate=False)):
        if id(param) not in first:
            first[id(param)] = (name, torch.nn.Parameter(torch.empty(param.shape,
                                                                     device="meta"),
                                                         requires_grad=False))
        slot, meta = first[id(param)]
        owner_name, _, leaf = name.rpartition(".")
        bindings.append(_Binding(module.get_submodule(owner_name), leaf, slot, meta))
        bindings[-1].owner._parameters[leaf] = meta
    return tuple(bindings)


def _check_flat(buffer: torch.Tensor, numel: int, what: str) -> None:
    if not (isinstance(buffer, torch.Tensor) and buffer.dtype == torch.float32
            and buffer.dim() == 1 and buffer.numel() == numel and buffer.is_contiguous()):
        got = (tuple(buffer.shape), buffer.dtype) if isinstance(buffer, torch.Tensor) else buffer
        raise ValueError(f"{what}: expected a contiguous fp32 tensor of {numel} elements, "
                         f"got {got}")


def _positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids counting only attended tokens, so left padding does not shift them."""
    return (mask.cumsum(-1) - 1).clamp(min=0)


def _tensor(array, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A tensor of ``array``; read-only arrays (zero-copy from Ray's object store) are copied,
    as torch cannot hold a read-only buffer."""
    array = np.asarray(array)
    tensor = torch.from_numpy(array if array.flags.writeable else array.copy())
    return tensor if dtype is None else tensor.to(dtype)


class Engine:
    """Runs one model's calls on flat fp32 buffers handed in with each call."""

    def __init__(self, spec: ModelSpec, seed: int = 0):
        self.spec, self.seed = spec, seed
        module = build_module(spec, seed)
        self._adopt(module, _layout(module))

    def _adopt(self, module: torch.nn.Module, layout: tuple[Slot, ...]) -> None:
        """Run on ``module``, whose trained parameters ``layout`` lays out (weights stripped)."""
        self._layout = layout
        self.numel = sum(s.numel for s in layout)
        #: exp_avg + exp_avg_sq + one step counter
        self.optimizer_numel = 2 * self.numel + 1
        self._config = module.config
        pad = self._config.pad_token_id
        self.pad_id = int(pad) if pad is not None else 0
        self._bindings = _strip_weights(module)
        self._module = module

    # --- buffers ---------------------------------------------------------------------------

    def initial_weights(self) -> torch.Tensor:
        """A flat fp32 copy of the seeded init (rebuilt from the seed; nothing is kept)."""
        return _flatten(build_module(self.spec, self.seed), self._layout)

    @contextmanager
    def _bound(self, weights: torch.Tensor, grad: bool = False):
        """Bind views of ``weights`` as the module's parameters for one call; yields them
        by Slot name (leaves that require grad when ``grad``). Unbinds on the way out."""
        _check_flat(weights, self.numel, "weights")
        views = {s.name: weights[s.offset:s.offset + s.numel].view(s.shape)
                 for s in self._layout}
        if grad:
            views = {n: v.detach().requires_grad_(True) for n, v in views.items()}
        try:
            for b in self._bindings:
                b.owner._parameters[b.leaf] = views[b.slot]
            yield views
        finally:
            for b in self._bindings:
                b.owner._parameters[b.leaf] = b.meta

    def _forward(self, input_ids, mask, positions, past=None):
        return self._module(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                            past_key_values=past, use_cache=past is not None)

    def _token_logprobs(self, input_ids, mask, temperature: float,
                        targets: torch.Tensor | None = None) -> torch.Tensor:
        logits = self._forward(input_ids, mask, _positions(mask)).logits
        if targets is not None:   # Tinker's alignment: position t scores targets[t]
            scaled = logits / (temperature or 1.0)
            return scaled.log_softmax(-1).gather(-1, targets[..., None]).squeeze(-1) * mask
        scaled = logits[:, :-1] / (temperature or 1.0)
        picked = scaled.log_softmax(-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
        # a token counts only when it and the one before it are attended: the first token
        # of a row (left-padded or not) has no context and gets 0
        return torch.cat([torch.zeros_like(picked[:, :1]), picked * mask[:, 1:] * mask[:, :-1]],
                         dim=1)

    def _inputs(self, input_ids, attention_mask):
        ids = _tensor(input_ids, torch.long)
        mask = (torch.ones_like(ids) if attention_mask is None
                else _tensor(attention_mask, torch.long))
        return ids, mask

    # --- calls -----------------------------------------------------------------------------

    def logprobs(self, weights, input_ids, attention_mask=None, *, temperature=1.0,
                 target_tokens=None):
        """log p(token t | tokens < t) under softmax(logits / temperature), shape (B, T).

        Column 0, a row's first attended token and masked positions are 0. Temperature 0
        means 1 (as in ``generate``). With ``target_tokens`` (B, T), column t is instead
        log p(target_tokens[t] | input_ids[:t + 1]) (Tinker's alignment; masked positions 0).
        """
        self._need_head("lm", "logprobs")
        ids, mask = self._inputs(input_ids, attention_mask)
        targets = None if target_tokens is None else _tensor(target_tokens, torch.long)
        with torch.no_grad(), self._bound(weights):
            return self._token_logprobs(ids, mask, temperature, targets).numpy()

    def forward_loss(self, weights, batch, loss: str, **loss_args) -> dict:
        """The loss of ``batch`` and its metrics, with no gradient taken (Tinker's
        ``forward``); with ``target_tokens`` in the batch, its per-token ``logprobs`` too."""
        with torch.no_grad(), self.loss_of(weights, batch, loss, loss_args) as (result, _, out):
            return self._answer(result, out, batch)

    def values(self, weights, input_ids, attention_mask=None) -> np.ndarray:
        """The value head's scalar at every position, shape (B, T); masked positions 0."""
        self._need_head("value", "values")
        ids, mask = self._inputs(input_ids, attention_mask)
        with torch.no_grad(), self._bound(weights):
            out = self._forward(ids, mask, _positions(mask))
            return (out.logits.squeeze(-1) * mask).numpy()

    def generate(self, weights, prompts, *, max_tokens, temperature=1.0, top_p=1.0,
                 stop=(), generator: torch.Generator,
                 rows: slice = slice(None)) -> dict[str, np.ndarray]:
        """Sample up to ``max_tokens`` after each prompt (batched, left-padded, KV cached).

        Returns ``tokens`` (B, max_tokens) filled with ``pad_id`` after a row's end,
        ``lengths`` (B,) counting a stop token that ended the row, ``logprobs``
        (B, max_tokens) of each sampled token (0 after the end), and ``stopped`` (B,) whether
        a row ended on a stop token rather than on ``max_tokens``. ``rows`` samples only those
        prompts (one rank's share), with the noise and padding the whole batch would get.
        """
        self._need_head("lm", "generate")
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("generate: every prompt needs at least one token")
        sampler = _Sampler(self, temperature, top_p, stop)
        shape = (len(prompts), max_tokens)   # greedy draws nothing from the generator
        noise = torch.rand(shape, generator=generator) if temperature > 0 else torch.zeros(shape)
        width = max(len(p) for p in prompts)
        with torch.no_grad(), self._bound(weights):
            return sampler.run(prompts[rows], noise[rows], width)

    def forward_backward(self, weights, grads, batch, loss: str, **loss_args):
        """Add d(loss)/d(weights) into ``grads``; returns the loss and its metrics.

        ``batch`` holds ``input_ids``, ``attention_mask`` and what the loss needs; the loss
        sees token logprobs (an "lm" loss, at ``loss_args['temperature']``, default 1) or
        values (a "value" loss). Pass ``num_tokens`` to normalise by a count shared by
        several calls, so that micro-batches accumulate to the whole batch's gradient.
        With ``target_tokens`` (B, T) in the batch, the logprobs are those of the targets
        (``logprobs``'s Tinker alignment) and are returned too, as ``logprobs``.
        """
        _check_flat(grads, self.numel, "grads")
        with self.loss_of(weights, batch, loss, loss_args) as (result, params, outputs):
            leaves = [params[s.name] for s in self._layout]
            grads_of = torch.autograd.grad(result.loss, leaves, allow_unused=True)
        for slot, g in zip(self._layout, grads_of):
            if g is not None:
                grads[slot.offset:slot.offset + slot.numel].add_(g.reshape(-1))
        return self._answer(result, outputs, batch)

    @staticmethod
    def _answer(result, outputs: torch.Tensor, batch) -> dict:
        out = {"loss": float(result.loss.detach()), **result.metrics}
        if "target_tokens" in batch:
            out["logprobs"] = outputs.detach().numpy()
        return out

    @contextmanager
    def loss_of(self, weights, batch, loss: str, loss_args: dict):
        """The loss of ``batch`` with ``weights`` bound as leaves that require grad (unless
        grad is off): yields the ``LossResult``, the leaves by Slot name (for the caller to
        differentiate) and the per-token outputs the loss saw."""
        loss_fn = get_loss(loss)
        self._need_head(loss_fn.head, f"loss {loss!r}")
        loss_args = dict(loss_args)
        temperature = loss_args.pop("temperature", 1.0)
        tensors = {k: _tensor(v) for k, v in batch.items()}
        ids, mask = self._inputs(tensors["input_ids"], tensors.get("attention_mask"))
        targets = tensors.get("target_tokens")
        with self._bound(weights, grad=torch.is_grad_enabled()) as params:
            if loss_fn.head == "lm":
                outputs = self._token_logprobs(ids, mask, temperature,
                                               None if targets is None else targets.long())
            else:
                outputs = self._forward(ids, mask, _positions(mask)).logits.squeeze(-1)
            yield loss_fn(outputs, tensors, **loss_args), params, outputs

    @property
    def layout(self) -> tuple[Slot, ...]:
        return self._layout

    def optim_step(self, weights, grads, optimizer, *, lr, betas=(0.9, 0.999), eps=1e-8,
                   weight_decay=0.0, max_grad_norm=None) -> dict[str, float]:
        """AdamW on the flat buffers in place (torch.optim.AdamW's arithmetic), grads zeroed.

        With ``max_grad_norm``, grads are first scaled as ``clip_grad_norm_`` does, the norm
        taken over the whole flat buffer. Returns ``grad_norm`` (before clipping) and ``step``.
        """
        _check_flat(weights, self.numel, "weights")
        _check_flat(grads, self.numel, "grads")
        _check_flat(optimizer, self.optimizer_numel, "optimizer")
        grad_norm = float(torch.linalg.vector_norm(grads))
        if max_grad_norm is not None:
            grads.mul_(min(max_grad_norm / (grad_norm + 1e-6), 1.0))
        n = self.numel
        exp_avg, exp_avg_sq, step_t = optimizer[:n], optimizer[n:2 * n], optimizer[2 * n:]
        _adamw(weights, grads, exp_avg, exp_avg_sq, step_t, lr=lr, beta1=betas[0],
               beta2=betas[1], eps=eps, weight_decay=weight_decay)
        grads.zero_()
        return {"grad_norm": grad_norm, "step": float(step_t.item())}

    # --- sizes -----------------------------------------------------------------------------

    def kv_bytes(self, batch: int, prompt_len: int, max_tokens: int) -> int:
        """Bytes of the KV cache a GENERATE of ``batch`` rows holds at its longest."""
        per_token = 2 * self.spec.num_layers * self.spec.kv_heads * self.spec.head_dim
        return per_token * batch * (prompt_len + max_tokens) * _FP32

    def activation_bytes(self, batch: int, seq_len: int) -> int:
        """An upper estimate of what a FORWARD_BACKWARD of (batch, seq_len) holds for backward.

        Per layer: about 8 hidden-sized and 4 intermediate-sized tensors per token, and the
        eager attention's scores and probabilities (heads x seq_len^2); then the logits, their
        log-softmax and its gradient (3 x vocab per token).
        """
        c = self._config
        tokens = batch * seq_len
        per_layer = tokens * (8 * c.hidden_size + 4 * c.intermediate_size) + \
            2 * batch * c.num_attention_heads * seq_len * seq_len
        head = 3 * tokens * (c.vocab_size if self.spec.head == "lm" else 1)
        return (c.num_hidden_layers * per_layer + head) * _FP32

    def _need_head(self, head: str, what: str) -> None:
        if self.spec.head != head:
            raise ConfigError(f"{what} needs a model with head {head!r}",
                              field=f"{self.spec.name}.head", value=self.spec.head)


def _adamw(param, grad, exp_avg, exp_avg_sq, step_t, *, lr, beta1, beta2, eps, weight_decay):
    """torch.optim.adam._single_tensor_adam (decoupled weight decay, no amsgrad), op for op."""
    step_t += 1
    if weight_decay != 0:
        param.mul_(1 - lr * weight_decay)
    exp_avg.lerp_(grad, 1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    step = step_t.item()
    bias_correction1 = 1 - beta1 ** step
    bias_correction2 = 1 - beta2 ** step
    step_size = lr / bias_correction1
    bias_correction2_sqrt = bias_correction2 ** 0.5
    denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(eps)
    param.addcdiv_(exp_avg, denom, value=-step_size)


class _Sampler:
    """One GENERATE call: prefill the left-padded prompts, then sample token by token."""

    def __init__(self, engine: Engine, temperature, top_p, stop):
        if temperature < 0 or not 0 < top_p <= 1:
            raise ValueError(f"generate: need temperature >= 0 and 0 < top_p <= 1, got "
                             f"{temperature}, {top_p}")
        self.engine = engine
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.stop = torch.tensor(sorted(set(int(s) for s in stop)), dtype=torch.long)

    def run(self, prompts, noise: torch.Tensor, width: int) -> dict[str, np.ndarray]:
        """Sample after ``prompts``, left-padded to ``width``; ``noise`` (rows, max_tokens)
        holds each row's uniforms, one per token."""
        pad, rows, max_tokens = self.engine.pad_id, len(prompts), noise.shape[1]
        if rows == 0:
            empty = np.zeros((0, max_tokens))
            return {"tokens": empty.astype(np.int64), "lengths": np.zeros(0, np.int64),
                    "logprobs": empty.astype(np.float32), "stopped": np.zeros(0, bool)}
        ids = torch.full((rows, width), pad, dtype=torch.long)
        mask = torch.zeros((rows, width), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            ids[i, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            mask[i, width - len(prompt):] = 1
        tokens = torch.full((rows, max_tokens), pad, dtype=torch.long)
        logprobs = torch.zeros((rows, max_tokens))
        lengths = torch.zeros(rows, dtype=torch.long)
        done = torch.zeros(rows, dtype=torch.bool)
        stopped = torch.zeros(rows, dtype=torch.bool)
        positions = _positions(mask)
        cache = DynamicCache(config=self.engine._config)
        out = self.engine._forward(ids, mask, positions, past=cache)
        for step in range(max_tokens):
            token, logprob = self._sample(out.logits[:, -1], noise[:, step])
            active = ~done
            tokens[:, step] = torch.where(active, token, pad)
            logprobs[:, step] = torch.where(active, logprob, 0.0)
            lengths += active.long()
            stopped |= active & torch.isin(token, self.stop)
            done = done | stopped
            if bool(done.all()) or step == max_tokens - 1:
                break
            mask = torch.cat([mask, active.long()[:, None]], dim=1)
            positions = positions[:, -1:] + 1
            out = self.engine._forward(tokens[:, step:step + 1], mask, positions,
                                       past=out.past_key_values)
        return {"tokens": tokens.numpy(), "lengths": lengths.numpy(),
                "logprobs": logprobs.numpy(), "stopped": stopped.numpy()}

    def _sample(self, logits: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(token, its logprob before truncation) for each row of ``logits`` (B, V): the token
        where the row's CDF (top-p truncated, in descending probability) first passes ``u``."""
        if self.temperature == 0:
            token = logits.argmax(-1)
            return token, logits.log_softmax(-1).gather(-1, token[:, None]).squeeze(-1)
        logp = (logits / self.temperature).log_softmax(-1)
        probs = logp.exp()
        if self.top_p < 1:
            sorted_probs, order = probs.sort(dim=-1, descending=True, stable=True)
            before = sorted_probs.cumsum(-1) - sorted_probs
            kept = torch.where(before < self.top_p, sorted_probs, 0.0)
            token = order.gather(-1, _inverse_cdf(kept, u)[:, None]).squeeze(-1)
        else:
            token = _inverse_cdf(probs, u)
        return token, logp.gather(-1, token[:, None]).squeeze(-1)


def _inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row of ``weights`` (B, V), unnormalised: the first index whose cumulative weight
    exceeds ``u`` times the row's total; never an index of weight 0."""
    cdf = weights.cumsum(-1)
    pick = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(-1)
    pick = pick.clamp(max=weights.shape[-1] - 1)
    # u * total can round onto the top of the CDF: step back over trailing zero weights
    last = (weights > 0).long().cumsum(-1).argmax(-1)
    return torch.minimum(pick, last)
