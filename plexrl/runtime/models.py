"""Model sources for the runtime: built-in tiny Hugging Face configs and local checkpoints.

Owns: the names of the built-in configs (tiny models built from code, never downloaded),
turning a ``ModelSpec.source`` into a Hugging Face config and a seeded torch module, and
deriving a ModelSpec's sizes from that config. Must not know where weights live between
calls (the ``StateStore`` owns the buffers; ``engine.Engine`` binds them) nor anything about
scheduling.

A source is either a built-in name (``BUILTIN_CONFIGS``) or a local directory holding a
Hugging Face checkpoint (``config.json`` + weights); nothing is ever fetched from a hub.
Modules are fp32 and in eval mode (no dropout: a training step is as deterministic as a
sampling step). The value head is ``AutoModelForTokenClassification`` with one label: the
same body as the language model, and a ``score`` Linear (hidden -> 1, with bias) in place of
``lm_head``, so a real checkpoint's body loads under it unchanged.

LoRA (docs/design.md, D215): ``add_adapters`` wraps the chosen Linear layers of a module in
``LoraLinear`` (``base(x) + alpha / r * B(A(x))``; ``A`` drawn as ``torch.nn.Linear`` draws
its weight, ``B`` zero, so a new adapter changes nothing), and ``model_spec(lora_rank=r)``
sizes a model as its adapters on a frozen base.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification,
                          LlamaConfig, PretrainedConfig, Qwen2Config)

from plexrl.errors import ConfigError
from plexrl.protocol import ModelSpec

#: attention kernel of every module built here: eager is plain matmul + softmax, deterministic
#: on CPU, no NaN rows under left-padding masks, as fast as sdpa at tiny sizes (docs/design.md, D67)
ATTN_IMPLEMENTATION = "eager"

_TINY = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=128, vocab_size=64, max_position_embeddings=256,
             tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0)

#: built-in configs by name: (config class, its keyword arguments)
BUILTIN_CONFIGS: dict[str, tuple[type[PretrainedConfig], dict]] = {
    "tiny-qwen2": (Qwen2Config, _TINY),                   # 82,496 parameters
    "tiny-llama": (LlamaConfig, _TINY),                   # 82,240 parameters
    "small-qwen2": (Qwen2Config, {**_TINY, "hidden_size": 256, "num_hidden_layers": 8,
                                  "num_attention_heads": 8, "num_key_value_heads": 4,
                                  "intermediate_size": 1024, "vocab_size": 4096,
                                  "max_position_embeddings": 1024}),  # 9,969,920 parameters
}


def hf_config(source: str, vocab_size: int | None = None) -> PretrainedConfig:
    """The Hugging Face config of ``source``: a built-in name or a local checkpoint directory.

    ``vocab_size`` resizes a built-in config's vocabulary; a checkpoint's vocabulary is that
    of its weights, so asking for another one is a ConfigError.
    """
    if source in BUILTIN_CONFIGS:
        cls, kwargs = BUILTIN_CONFIGS[source]
        config = cls(**kwargs)
        if vocab_size is not None:
            config.vocab_size = int(vocab_size)
        return config
    if source and os.path.isdir(source):
        config = AutoConfig.from_pretrained(source, local_files_only=True)
        if vocab_size is not None and vocab_size != config.vocab_size:
            raise ConfigError("a checkpoint's vocabulary cannot be resized", field="vocab_size",
                              value=vocab_size, fix=f"use {config.vocab_size} or omit it")
        return config
    raise ConfigError("unknown model source", field="source", value=source,
                      fix=f"use one of {sorted(BUILTIN_CONFIGS)} or a local checkpoint directory")


def _head_class(head: str):
    return AutoModelForCausalLM if head == "lm" else AutoModelForTokenClassification


def _head_config(config: PretrainedConfig, head: str) -> PretrainedConfig:
    if head == "value":
        config.num_labels = 1
    config._attn_implementation = ATTN_IMPLEMENTATION
    return config


def build_module(spec: ModelSpec, seed: int) -> torch.nn.Module:
    """The torch module of ``spec`` (fp32, eval mode), its random init drawn from ``seed``.

    A built-in source is initialised from the seed alone; a checkpoint directory loads its
    weights, and only parts it lacks (a value head's ``score``) are drawn from the seed. The
    global RNG is forked, so building a module neither reads nor advances the caller's RNG.
    """
    cls = _head_class(spec.head)
    config = _head_config(hf_config(spec.source), spec.head)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if spec.source in BUILTIN_CONFIGS:
            module = cls.from_config(config, attn_implementation=ATTN_IMPLEMENTATION,
                                     dtype=torch.float32)
        else:
            module = cls.from_pretrained(spec.source, config=config, local_files_only=True,
                                         attn_implementation=ATTN_IMPLEMENTATION,
                                         dtype=torch.float32)
    return module.float().eval()


def _adapter_params(config: PretrainedConfig, rank: int, parts: tuple[str, ...]) -> int:
    with torch.device("meta"):
        module = _head_class("lm").from_config(_head_config(config, "lm"))
    return sum(rank * (sub.in_features + sub.out_features)
               for sub in (module.get_submodule(n) for n in lora_targets(module, parts)))


def _count_params(config: PretrainedConfig, head: str) -> tuple[int, int]:
    """(total, active) parameters of the module, counted on the meta device (no memory)."""
    with torch.device("meta"):
        module = _head_class(head).from_config(_head_config(config, head))
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    top_k = getattr(config, "num_experts_per_tok", None)
    total = active = 0
    for name, param in module.named_parameters():
        total += param.numel()
        routed = experts and top_k and ".experts." in name
        active += param.numel() * top_k / experts if routed else param.numel()
    return total, int(active)


LORA_ALPHA = 32.0                #: LoRA's alpha: an adapter's output is scaled by alpha / rank
#: the Linear layers each LoRA part adapts (Tinker's LoraConfig: train_attn, train_mlp,
#: train_unembed), by their name in Llama and Qwen2 modules
LORA_PARTS: dict[str, tuple[str, ...]] = {
    "attn": ("q_proj", "k_proj", "v_proj", "o_proj"),
    "mlp": ("gate_proj", "up_proj", "down_proj"),
    "unembed": ("lm_head",),
}


class LoraLinear(torch.nn.Module):
    """A frozen Linear (``base``) plus a rank-``r`` adapter: ``base(x) + scale * B(A(x))``."""

    def __init__(self, base: torch.nn.Linear, rank: int, scale: float):
        super().__init__()
        self.base, self.scale = base, scale
        self.lora_A = torch.nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_B = torch.nn.Parameter(torch.zeros(base.out_features, rank))
        torch.nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        adapted = torch.nn.functional.linear(torch.nn.functional.linear(x, self.lora_A),
                                             self.lora_B)
        return self.base(x) + self.scale * adapted


def lora_targets(module: torch.nn.Module, parts: tuple[str, ...]) -> list[str]:
    """The names of the Linear layers of ``module`` that ``parts`` adapt."""
    unknown = sorted(set(parts) - set(LORA_PARTS))
    if unknown:
        raise ConfigError(f"unknown LoRA parts {unknown}", field="lora_targets", value=parts,
                          fix=f"use some of {sorted(LORA_PARTS)}")
    leaves = {leaf for part in parts for leaf in LORA_PARTS[part]}
    return [name for name, sub in module.named_modules()
            if isinstance(sub, torch.nn.Linear) and name.rpartition(".")[2] in leaves]


def add_adapters(module: torch.nn.Module, rank: int, parts: tuple[str, ...],
                 seed: int) -> torch.nn.Module:
    """Wrap the targets of ``parts`` in ``LoraLinear`` adapters drawn from ``seed`` (the
    global RNG is forked, as in ``build_module``); adapter parameters are named ``lora_*``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for name in lora_targets(module, parts):
            owner, _, leaf = name.rpartition(".")
            parent = module.get_submodule(owner)
            setattr(parent, leaf, LoraLinear(getattr(parent, leaf), rank, LORA_ALPHA / rank))
    return module


def is_adapter(name: str) -> bool:
    return ".lora_A" in name or ".lora_B" in name or name.startswith("lora_")


def model_spec(name: str, source: str, head: str = "lm", *, lora_rank: int = 0,
               lora_targets: tuple[str, ...] = tuple(LORA_PARTS), **kw) -> ModelSpec:
    """A ModelSpec whose sizes are those of ``source``'s config, stored as fp32.

    ``kv_cache_tokens`` is 0: the runtime reserves KV cache per GENERATE call
    (``Engine.kv_bytes``), not as a standing State. ``sharded``: on a worker group of n
    devices the runtime splits every State over the n ranks (``workers/sharded.py``).
    ``lora_rank`` r > 0: adapters of rank r on the ``lora_targets`` parts of ``source`` as a
    frozen base (its WEIGHTS, GRADS and OPTIMIZER are the adapters'; the base is a BASE
    State of the worker group). ``kw`` sets any other ModelSpec field.
    """
    config = hf_config(source)
    total, active = _count_params(config, head)
    if lora_rank:
        if head != "lm":
            raise ConfigError("LoRA adapts language models here", field=f"{name}.head",
                              value=head, fix="head='lm', or train the value model whole")
        kw = dict(lora_rank=lora_rank, base=source, base_params=float(total),
                  lora_targets=tuple(lora_targets), **kw)
        total = _adapter_params(config, lora_rank, tuple(lora_targets))
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    spec = ModelSpec(name=name, total_params=float(total), active_params=float(active),
                     num_layers=config.num_hidden_layers,
                     kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                     head_dim=head_dim, dtype_bytes=4, head=head, source=source,
                     kv_cache_tokens=0, vocab_size=config.vocab_size, sharded=True)
    return replace(spec, **kw) if kw else spec
