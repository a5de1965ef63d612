"""The losses package on hand-built tensors: registry, GRPO's clip and KL, SFT, value loss.

No model is involved: a loss sees (B, T) outputs and a batch of tensors, as the engine
hands them over.
"""

from __future__ import annotations

import math

import hypothesis.strategies as st
import pytest
import torch
from hypothesis import given

from plexrl.errors import ConfigError
from plexrl.losses import LOSSES, get_loss


def _policy_batch(old, advantages, mask=None, ref=None):
    old = torch.tensor(old, dtype=torch.float32)
    batch = {"old_logprobs": old, "advantages": torch.tensor(advantages),
             "loss_mask": torch.ones_like(old) if mask is None else torch.tensor(mask)}
    if ref is not None:
        batch["ref_logprobs"] = torch.tensor(ref, dtype=torch.float32)
    return batch


def test_registry_names_heads_and_unknown_name():
    assert {name: fn.head for name, fn in LOSSES.items()} == {
        "cross_entropy": "lm", "grpo": "lm", "importance_sampling": "lm", "ppo": "lm",
        "cispo": "lm", "value": "value"}
    with pytest.raises(ConfigError, match=r"\['cispo', 'cross_entropy', 'grpo', "
                                          r"'importance_sampling', 'ppo', 'value'\]"):
        get_loss("dpo")


def test_missing_batch_key_and_unknown_argument_are_config_errors():
    logprobs = torch.zeros(1, 3)
    with pytest.raises(ConfigError, match="advantages"):
        get_loss("grpo")(logprobs, {"loss_mask": torch.ones(1, 3),
                                    "old_logprobs": torch.zeros(1, 3)})
    with pytest.raises(ConfigError, match="clip_eps"):
        get_loss("grpo")(logprobs, _policy_batch([[0.0] * 3], [1.0]), clip_eps=0.1)
    with pytest.raises(ConfigError, match="ref_logprobs"):
        get_loss("grpo")(logprobs, _policy_batch([[0.0] * 3], [1.0]), kl_coef=0.1)


def test_grpo_on_policy_is_minus_the_mean_advantage():
    old = [[-1.0, -2.0, -0.5], [-0.3, -0.7, -1.1]]
    logprobs = torch.tensor(old, requires_grad=True)
    batch = _policy_batch(old, [2.0, -1.0], mask=[[0, 1, 1], [1, 1, 0]], ref=old)
    result = get_loss("grpo")(logprobs, batch, kl_coef=0.5)
    assert result.loss.item() == pytest.approx(-(2 + 2 - 1 - 1) / 4)
    assert result.metrics == {"num_tokens": 4.0, "clip_frac": 0.0, "ratio_mean": 1.0,
                              "kl": 0.0}
    result.loss.backward()  # d/dlogprob of -A * ratio at ratio 1 is -A / N on masked tokens
    assert torch.allclose(logprobs.grad, torch.tensor([[0, -0.5, -0.5], [0.25, 0.25, 0]]))


@pytest.mark.parametrize(("ratio", "advantage", "clipped"), [
    (1.50, 1.0, True),    # above 1 + eps_high, pushing up: clipped
    (1.25, 1.0, False),   # inside the asymmetric upper bound 1.28
    (1.50, -1.0, False),  # above, pushing down: the unclipped term wins
    (0.70, -1.0, True),   # below 1 - eps_low, pushing down: clipped
    (0.85, -1.0, False),  # inside the lower bound 0.8
    (0.70, 1.0, False),   # below, pushing up: the unclipped term wins
])
def test_grpo_asymmetric_clip(ratio, advantage, clipped):
    logprobs = torch.tensor([[math.log(ratio)]], requires_grad=True)
    result = get_loss("grpo")(logprobs, _policy_batch([[0.0]], [advantage]))
    result.loss.backward()
    assert result.metrics["clip_frac"] == float(clipped)
    assert result.metrics["ratio_mean"] == pytest.approx(ratio)
    assert (logprobs.grad.item() == 0.0) == clipped
    bound = 1.28 if ratio > 1 else 0.8
    expected = -advantage * (bound if clipped else ratio)
    assert result.loss.item() == pytest.approx(expected, rel=1e-6)


def test_grpo_k3_kl_is_the_k3_estimator():
    new, ref = [[-1.0, -2.0]], [[-1.5, -1.0]]
    logprobs = torch.tensor(new)
    result = get_loss("grpo")(logprobs, _policy_batch(new, [0.0], ref=ref), kl_coef=2.0)
    k3 = [math.exp(r - n) - (r - n) - 1 for r, n in zip(ref[0], new[0])]
    assert result.metrics["kl"] == pytest.approx(sum(k3) / 2)
    assert result.loss.item() == pytest.approx(2.0 * sum(k3) / 2)


def test_cross_entropy_averages_masked_tokens_only():
    logprobs = torch.tensor([[-9.0, -1.0, -3.0], [-2.0, -9.0, -9.0]])
    mask = torch.tensor([[0, 1, 1], [1, 0, 0]])
    result = get_loss("cross_entropy")(logprobs, {"loss_mask": mask})
    assert result.loss.item() == pytest.approx(2.0)
    assert result.metrics == {"num_tokens": 3.0, "nll": 2.0}
    shared = get_loss("cross_entropy")(logprobs, {"loss_mask": mask}, num_tokens=6)
    assert shared.loss.item() == pytest.approx(1.0)


def test_value_loss_clips_around_old_values():
    values = torch.tensor([[1.0, 0.5]], requires_grad=True)
    batch = {"loss_mask": torch.ones(1, 2), "returns": torch.tensor([[0.0, 0.5]]),
             "old_values": torch.tensor([[0.5, 0.0]])}
    result = get_loss("value")(values, batch, clip=0.2)
    # token 0: v=1 moved 0.5 from old; clipped 0.7, (0.7-0)^2 < (1-0)^2, unclipped wins
    # token 1: v=0.5 = return; clipped 0.2, (0.2-0.5)^2 > 0: the clipped term wins
    assert result.loss.item() == pytest.approx(0.5 * (1.0 + 0.09) / 2)
    assert result.metrics["clip_frac"] == 0.5
    result.loss.backward()
    assert values.grad[0, 1].item() == 0.0 and values.grad[0, 0].item() > 0


@given(st.integers(2, 6), st.integers(1, 5), st.integers(0, 2**31 - 1), st.integers(1, 5))
def test_micro_batches_sharing_num_tokens_add_up_to_the_batch(rows, length, seed, split):
    rng = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(rows, length, generator=rng) * 3
    batch = {"loss_mask": (torch.rand(rows, length, generator=rng) > 0.3).float(),
             "old_logprobs": logprobs + 0.3 * torch.randn(rows, length, generator=rng),
             "advantages": torch.randn(rows, generator=rng)}
    split = min(split, rows - 1)
    total = float(batch["loss_mask"].sum())
    whole = get_loss("grpo")(logprobs, batch, num_tokens=total).loss
    parts = sum(get_loss("grpo")(logprobs[rows_], {k: v[rows_] for k, v in batch.items()},
                                 num_tokens=total).loss
                for rows_ in (slice(0, split), slice(split, rows)))
    assert torch.allclose(whole, parts, atol=1e-6)


# --- Tinker's policy-gradient losses, as its docs define them (sums with num_tokens=1) ------

def _tinker_case():
    new = torch.tensor([[-1.0, -0.5, -2.0, -0.3]], requires_grad=True)
    batch = _policy_batch([[-1.2, -0.4, -1.0, -0.3]], [[1.0, -2.0, 0.5, 0.0]],
                          mask=[[1.0, 1.0, 1.0, 0.0]])
    return new, batch, (new - batch["old_logprobs"]).exp().detach()


def test_importance_sampling_is_minus_the_summed_ratio_times_advantage_and_its_gradient():
    new, batch, ratio = _tinker_case()
    out = get_loss("importance_sampling")(new, batch, num_tokens=1.0)
    mask, adv = batch["loss_mask"], batch["advantages"]
    assert out.loss.item() == pytest.approx(float(-(ratio * adv * mask).sum()), rel=1e-6)
    out.loss.backward()   # d/dlogp of -r A = -r A
    torch.testing.assert_close(new.grad, -ratio * adv * mask)


def test_ppo_clips_the_ratio_to_tinkers_thresholds():
    new, batch, ratio = _tinker_case()
    out = get_loss("ppo")(new, batch, num_tokens=1.0)
    adv, mask = batch["advantages"], batch["loss_mask"]
    want = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    assert out.loss.item() == pytest.approx(float((want * mask).sum()), rel=1e-6)
    narrow = get_loss("ppo")(new, batch, num_tokens=1.0, clip_low_threshold=0.9,
                             clip_high_threshold=1.1)
    want = -torch.minimum(ratio * adv, ratio.clamp(0.9, 1.1) * adv)
    assert narrow.loss.item() == pytest.approx(float((want * mask).sum()), rel=1e-6)


def test_cispo_weights_logprobs_by_the_detached_clipped_ratio():
    new, batch, ratio = _tinker_case()
    out = get_loss("cispo")(new, batch, num_tokens=1.0)
    adv, mask = batch["advantages"], batch["loss_mask"]
    weight = ratio.clamp(0.8, 1.2)
    assert out.loss.item() == pytest.approx(float((-weight * new.detach() * adv * mask).sum()),
                                            rel=1e-6)
    out.loss.backward()   # no gradient through the ratio: d/dlogp = -clip(r) A
    torch.testing.assert_close(new.grad, -weight * adv * mask)
    assert out.metrics["clip_frac"] > 0   # the third token's ratio e^-1 is clipped


def test_weighted_cross_entropy_with_num_tokens_one_is_tinkers_sum():
    logprobs = torch.tensor([[-1.0, -2.0, -3.0]])
    out = get_loss("cross_entropy")(logprobs, {"loss_mask": torch.tensor([[0.0, 0.5, 2.0]])},
                                    num_tokens=1.0)
    assert out.loss.item() == pytest.approx(0.5 * 2.0 + 2.0 * 3.0)
