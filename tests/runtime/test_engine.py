"""The PyTorch engine on tiny built-in models: sampling, logprobs, training, sizes.

Every test runs real tiny Hugging Face modules (tiny-qwen2, 82,496 parameters) on flat
buffers, the way the state manager hands them in. Nothing is downloaded.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plexrl.errors import ConfigError
from plexrl.runtime.workers.engine import Engine
from plexrl.runtime.models import BUILTIN_CONFIGS, build_module, hf_config, model_spec

PROMPTS = [[1, 5, 6], [1, 7], [3, 4, 5, 6, 7, 8], [9]]


@pytest.fixture(scope="module")
def engine():
    return Engine(model_spec("policy", "tiny-qwen2"), seed=0)


@pytest.fixture(scope="module")
def critic():
    return Engine(model_spec("critic", "tiny-qwen2", head="value"), seed=0)


@pytest.fixture(scope="module")
def weights(engine):
    return engine.initial_weights()


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _sequences(prompts, out):
    """Left-padded prompt + completion ids and mask, and where completions start."""
    width = max(len(p) for p in prompts)
    rows, max_tokens = out["tokens"].shape
    ids = np.zeros((rows, width + max_tokens), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, prompt in enumerate(prompts):
        ids[i, width - len(prompt):width] = prompt
        mask[i, width - len(prompt):width] = 1
        n = out["lengths"][i]
        ids[i, width:width + n] = out["tokens"][i, :n]
        mask[i, width:width + n] = 1
    return ids, mask, width


def _sft_batch(rows=4, length=12, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, 64, size=(rows, length))
    mask = np.ones_like(ids)
    loss_mask = np.zeros_like(ids)
    loss_mask[:, length // 2:] = 1
    return {"input_ids": ids, "attention_mask": mask, "loss_mask": loss_mask}


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_generate_logprobs_agree_with_logprobs_and_ratio_is_one(engine, weights, temperature):
    out = engine.generate(weights, PROMPTS, max_tokens=12, temperature=temperature,
                          stop=[2, 3], generator=_gen(1))
    ids, mask, start = _sequences(PROMPTS, out)
    new = engine.logprobs(weights, ids, mask, temperature=temperature)[:, start:]
    valid = np.arange(12)[None, :] < out["lengths"][:, None]
    assert valid.sum() > 20
    assert np.abs(new - out["logprobs"])[valid].max() <= 1e-5
    assert np.abs(np.exp(new - out["logprobs"]) - 1.0)[valid].max() <= 1e-5
    # the same through the GRPO loss, on-policy: every ratio 1, nothing clipped
    old = np.zeros(ids.shape, dtype=np.float32)
    old[:, start:] = out["logprobs"]
    loss_mask = mask.copy()
    loss_mask[:, :start] = 0
    batch = {"input_ids": ids, "attention_mask": mask, "loss_mask": loss_mask,
             "old_logprobs": old, "advantages": np.array([1.0, -1.0, 0.5, 2.0])}
    grads = torch.zeros(engine.numel)
    metrics = engine.forward_backward(weights, grads, batch, "grpo", temperature=temperature)
    assert abs(metrics["ratio_mean"] - 1.0) <= 1e-5
    assert metrics["clip_frac"] == 0.0


def test_same_generator_state_gives_bitwise_same_tokens(engine, weights):
    first = engine.generate(weights, PROMPTS, max_tokens=10, generator=_gen(7))
    again = engine.generate(weights, PROMPTS, max_tokens=10, generator=_gen(7))
    other = engine.generate(weights, PROMPTS, max_tokens=10, generator=_gen(8))
    for key in first:
        assert np.array_equal(first[key], again[key]), key
    assert not np.array_equal(first["tokens"], other["tokens"])


def test_moved_state_gives_bitwise_same_results(engine, weights):
    moved = torch.empty_like(weights).copy_(weights)  # other storage, same bytes
    assert moved.data_ptr() != weights.data_ptr()
    a = engine.generate(weights, PROMPTS, max_tokens=8, generator=_gen(3))
    b = engine.generate(moved, PROMPTS, max_tokens=8, generator=_gen(3))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    batch = _sft_batch()
    grads_a, grads_b = torch.zeros(engine.numel), torch.zeros(engine.numel)
    engine.forward_backward(weights, grads_a, batch, "cross_entropy")
    engine.forward_backward(moved, grads_b, batch, "cross_entropy")
    assert torch.equal(grads_a, grads_b) and grads_a.abs().sum() > 0
    # the engine keeps no weights of its own between calls
    assert all(p.device.type == "meta" for p in engine._module.parameters())


def test_stop_tokens_end_rows_and_pad_the_rest(engine, weights):
    stop = list(range(0, 64, 3))  # a third of the vocabulary: most rows stop early
    out = engine.generate(weights, PROMPTS * 4, max_tokens=16, stop=stop, generator=_gen(5))
    tokens, lengths, logprobs, stopped = (out[k] for k in ("tokens", "lengths", "logprobs",
                                                           "stopped"))
    assert stopped.sum() >= 12 and lengths.min() < 16
    for row in range(len(tokens)):
        n = lengths[row]
        assert (tokens[row, n:] == engine.pad_id).all() and (logprobs[row, n:] == 0).all()
        assert not np.isin(tokens[row, :n - 1], stop).any()
        assert stopped[row] == (tokens[row, n - 1] in stop)
        assert stopped[row] or n == 16
        assert (logprobs[row, :n] < 0).all()


def test_top_p_changes_samples_but_not_the_reported_distribution(engine, weights):
    full = engine.generate(weights, PROMPTS, max_tokens=12, temperature=0.9, top_p=1.0,
                           generator=_gen(11))
    nucleus = engine.generate(weights, PROMPTS, max_tokens=12, temperature=0.9, top_p=0.3,
                              generator=_gen(11))
    assert not np.array_equal(full["tokens"], nucleus["tokens"])
    ids, mask, start = _sequences(PROMPTS, nucleus)
    untruncated = engine.logprobs(weights, ids, mask, temperature=0.9)[:, start:]
    assert np.abs(untruncated - nucleus["logprobs"]).max() <= 1e-5
    # a vanishing nucleus keeps only the most likely token: greedy tokens, T=0.9 logprobs
    tiny = engine.generate(weights, PROMPTS, max_tokens=12, temperature=0.9, top_p=1e-9,
                           generator=_gen(11))
    greedy = engine.generate(weights, PROMPTS, max_tokens=12, temperature=0.0,
                             generator=_gen(11))
    assert np.array_equal(tiny["tokens"], greedy["tokens"])
    ids, mask, start = _sequences(PROMPTS, tiny)
    assert np.abs(engine.logprobs(weights, ids, mask, temperature=0.9)[:, start:]
                  - tiny["logprobs"]).max() <= 1e-5


def test_greedy_draws_nothing_from_the_generator(engine, weights):
    g = _gen(2)
    before = g.get_state().clone()
    engine.generate(weights, PROMPTS, max_tokens=6, temperature=0.0, generator=g)
    assert torch.equal(g.get_state(), before)


def test_sft_steps_reduce_the_loss(engine, weights):
    w, grads = weights.clone(), torch.zeros(engine.numel)
    optimizer = torch.zeros(engine.optimizer_numel)
    batch = _sft_batch(rows=2, length=10, seed=3)
    losses = []
    for _ in range(8):
        losses.append(engine.forward_backward(w, grads, batch, "cross_entropy")["loss"])
        metrics = engine.optim_step(w, grads, optimizer, lr=1e-2, max_grad_norm=1.0)
        assert (grads == 0).all()
    assert metrics["step"] == 8.0
    assert losses[-1] < 0.8 * losses[0], losses


def test_optim_step_equals_torch_adamw_bitwise(engine, weights):
    rng = torch.Generator().manual_seed(0)
    w, optimizer = weights.clone(), torch.zeros(engine.optimizer_numel)
    params = [torch.nn.Parameter(weights[s.offset:s.offset + s.numel].view(s.shape).clone())
              for s in engine._layout]
    reference = torch.optim.AdamW(params, lr=3e-3, betas=(0.8, 0.95), eps=1e-6,
                                  weight_decay=0.1)
    for _ in range(4):
        grads = torch.randn(engine.numel, generator=rng)
        for p, s in zip(params, engine._layout):
            p.grad = grads[s.offset:s.offset + s.numel].view(s.shape).clone()
        reference.step()
        engine.optim_step(w, grads, optimizer, lr=3e-3, betas=(0.8, 0.95), eps=1e-6,
                          weight_decay=0.1)
    assert torch.equal(w, torch.cat([p.detach().reshape(-1) for p in params]))
    exp_avg = torch.cat([reference.state[p]["exp_avg"].reshape(-1) for p in params])
    assert torch.equal(optimizer[:engine.numel], exp_avg)


def test_forward_backward_accumulates_into_grads(engine, weights):
    batch = _sft_batch(rows=4, length=12, seed=1)
    total = float(batch["loss_mask"].sum())
    whole = torch.zeros(engine.numel)
    engine.forward_backward(weights, whole, batch, "cross_entropy")
    halves = torch.zeros(engine.numel)
    for rows in (slice(0, 2), slice(2, 4)):
        part = {k: v[rows] for k, v in batch.items()}
        engine.forward_backward(weights, halves, part, "cross_entropy", num_tokens=total)
    assert (halves - whole).abs().max() <= 1e-6
    engine.forward_backward(weights, whole, batch, "cross_entropy")
    assert torch.allclose(whole, 2 * halves, atol=2e-6)


def test_value_head_shapes_and_loss(critic):
    w = critic.initial_weights()
    batch = _sft_batch(rows=3, length=9)
    values = critic.values(w, batch["input_ids"], batch["attention_mask"])
    assert values.shape == (3, 9) and values.dtype == np.float32
    batch.update(returns=np.ones((3, 9), dtype=np.float32), old_values=values)
    grads = torch.zeros(critic.numel)
    metrics = critic.forward_backward(w, grads, batch, "value", clip=0.2)
    assert metrics["loss"] > 0 and grads.abs().sum() > 0
    assert metrics["value_mean"] == pytest.approx(float(values[:, 4:].mean()), abs=1e-5)
    with pytest.raises(ConfigError, match="head 'lm'"):
        critic.forward_backward(w, grads, batch, "cross_entropy")
    with pytest.raises(ConfigError, match="head 'lm'"):
        critic.logprobs(w, batch["input_ids"], None)


def test_bad_loss_name_and_unknown_source_are_config_errors(engine, weights):
    with pytest.raises(ConfigError, match="cross_entropy.*grpo.*value"):
        engine.forward_backward(weights, torch.zeros(engine.numel), _sft_batch(), "ppo2")
    with pytest.raises(ConfigError, match="advantages"):  # raised with the weights bound
        engine.forward_backward(weights, torch.zeros(engine.numel), _sft_batch(), "grpo")
    assert all(p.device.type == "meta" for p in engine._module.parameters())
    with pytest.raises(ConfigError, match="tiny-qwen2"):
        hf_config("gpt-17")
    with pytest.raises(ConfigError, match="tiny-llama"):
        model_spec("m", "no/such/dir")


def test_a_wrong_buffer_is_refused(engine, weights):
    with pytest.raises(ValueError, match="weights"):
        engine.logprobs(weights[:-1], np.array([[1, 2]]), None)
    with pytest.raises(ValueError, match="optimizer"):
        engine.optim_step(weights.clone(), torch.zeros(engine.numel),
                          torch.zeros(2 * engine.numel), lr=1e-3)


@pytest.mark.parametrize("source", ["tiny-qwen2", "tiny-llama"])
def test_initial_weights_come_from_the_seed_alone(source):
    spec = model_spec("m", source)
    torch.manual_seed(123)
    rng_before = torch.random.get_rng_state()
    a, b = Engine(spec, seed=4), Engine(spec, seed=5)
    assert torch.equal(torch.random.get_rng_state(), rng_before)
    assert torch.equal(a.initial_weights(), Engine(spec, seed=4).initial_weights())
    assert not torch.equal(a.initial_weights(), b.initial_weights())
    assert a.numel == spec.total_params == sum(p.numel() for p in build_module(spec, 4)
                                               .parameters())


def test_model_spec_sizes_come_from_the_config():
    spec = model_spec("m", "tiny-qwen2", tp=2)
    config = hf_config("tiny-qwen2")
    assert (spec.num_layers, spec.kv_heads, spec.head_dim) == (2, 2, 16)
    assert spec.active_params == spec.total_params and spec.tp == 2
    assert (spec.dtype_bytes, spec.kv_cache_tokens, spec.source) == (4, 0, "tiny-qwen2")
    assert config.vocab_size == 64 and hf_config("tiny-qwen2", vocab_size=96).vocab_size == 96
    assert set(BUILTIN_CONFIGS) >= {"tiny-qwen2", "tiny-llama", "small-qwen2"}


def test_kv_bytes_equal_the_cache_a_generate_holds(engine, weights):
    rows, prompt_len, max_tokens = 3, 5, 7
    module = build_module(engine.spec, 0)
    ids = torch.ones((rows, prompt_len + max_tokens), dtype=torch.long)
    with torch.no_grad():
        cache = module(input_ids=ids, use_cache=True).past_key_values
    held = sum(t.numel() * t.element_size() for layer in cache.layers
               for t in (layer.keys, layer.values))
    assert engine.kv_bytes(rows, prompt_len, max_tokens) == held
    assert engine.activation_bytes(2, 64) > 2 * 64 * 64 * 4 * 3


def test_left_padding_changes_nothing(engine, weights):
    alone = [engine.logprobs(weights, np.array([p]), None)[0] for p in PROMPTS]
    width = max(len(p) for p in PROMPTS)
    ids = np.array([[0] * (width - len(p)) + p for p in PROMPTS])
    mask = np.array([[0] * (width - len(p)) + [1] * len(p) for p in PROMPTS])
    padded = engine.logprobs(weights, ids, mask)
    for row, prompt in enumerate(PROMPTS):
        assert np.allclose(padded[row, width - len(prompt):], alone[row], rtol=0, atol=1e-5)
        assert padded[row, width - len(prompt)] == 0.0  # no context: no logprob
    batched = engine.generate(weights, PROMPTS, max_tokens=8, temperature=0.0,
                              generator=_gen(0))
    for row, prompt in enumerate(PROMPTS):
        single = engine.generate(weights, [prompt], max_tokens=8, temperature=0.0,
                                 generator=_gen(0))
        assert np.array_equal(single["tokens"][0], batched["tokens"][row])


def test_a_local_checkpoint_loads_its_weights(tmp_path, engine, weights):
    build_module(engine.spec, 0).save_pretrained(tmp_path)
    policy = Engine(model_spec("ckpt", str(tmp_path)), seed=9)  # the seed draws nothing
    assert torch.equal(policy.initial_weights(), weights)
    critic = Engine(model_spec("ckpt-critic", str(tmp_path), head="value"), seed=9)
    body = {s.name: s for s in critic._layout if s.name.startswith("model.")}
    loaded = critic.initial_weights()
    for slot in engine._layout:
        if slot.name in body:
            mine = body[slot.name]
            assert torch.equal(loaded[mine.offset:mine.offset + mine.numel],
                               weights[slot.offset:slot.offset + slot.numel])
    assert len(body) == len(engine._layout) - 1  # all but lm_head
    with pytest.raises(ConfigError, match="resized"):
        hf_config(str(tmp_path), vocab_size=128)
