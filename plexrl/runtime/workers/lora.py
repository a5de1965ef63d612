"""A LoRA model's engine: its calls run on its adapters' flat buffers and a frozen base that
several jobs share (docs/design.md, D215).

Owns: ``LoraEngine``, an ``Engine`` whose weights, grads and optimizer buffers are the
adapters' (``models.add_adapters`` on every Linear of the chosen parts), so OPTIM_STEP,
SYNC_WEIGHTS, SAVE and LOAD move only adapters; and the base, whose flat buffer comes in
with each call that runs the model forward (``on_base``) and is never written. The base's
weights are its source's: a built-in config drawn from ``BASE_SEED`` (the same for every
job), or a checkpoint directory's. Must not know where either buffer lives between calls.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from plexrl.protocol import ModelSpec
from plexrl.runtime.models import add_adapters, build_module, is_adapter
from plexrl.runtime.workers.engine import Engine, _check_flat, _flatten, _layout

BASE_SEED = 0        #: a built-in base's weights are drawn from this seed, whichever job asks


class LoraEngine(Engine):
    def __init__(self, spec: ModelSpec, seed: int = 0):
        self.spec, self.seed = spec, seed
        module = self._build()
        self._base_layout = _layout(module, lambda name: not is_adapter(name))
        self.base_numel = sum(s.numel for s in self._base_layout)
        self._adopt(module, _layout(module, is_adapter))
        self._base: torch.Tensor | None = None

    def _build(self) -> torch.nn.Module:
        return add_adapters(build_module(self.spec, BASE_SEED), self.spec.lora_rank,
                            self.spec.lora_targets, self.seed)

    def initial_weights(self) -> torch.Tensor:
        """The adapters as drawn from the job's seed (B zero: the model is its base)."""
        return _flatten(self._build(), self._layout)

    def initial_base(self) -> torch.Tensor:
        return _flatten(self._build(), self._base_layout)

    @contextmanager
    def on_base(self, base: torch.Tensor):
        """The calls inside run on ``base`` (the group's BASE State, pinned by the caller)."""
        _check_flat(base, self.base_numel, "base")
        self._base = base
        try:
            yield
        finally:
            self._base = None

    @contextmanager
    def _bound(self, weights: torch.Tensor, grad: bool = False):
        """As ``Engine._bound`` with ``weights`` the adapters; the base is bound read-only."""
        _check_flat(weights, self.numel, "adapters")
        if self._base is None:
            raise RuntimeError("a LoRA call ran with no base: run it inside on_base()")
        views = {s.name: self._base[s.offset:s.offset + s.numel].view(s.shape)
                 for s in self._base_layout}
        adapters = {s.name: weights[s.offset:s.offset + s.numel].view(s.shape)
                    for s in self._layout}
        if grad:
            adapters = {n: v.detach().requires_grad_(True) for n, v in adapters.items()}
        views.update(adapters)
        try:
            for b in self._bindings:
                b.owner._parameters[b.leaf] = views[b.slot]
            yield adapters
        finally:
            for b in self._bindings:
                b.owner._parameters[b.leaf] = b.meta
