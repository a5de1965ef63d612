"""Tests of plexrl.sim.experiments.workload: the decode roofline, length draws and the rollout simulator.

The rollout simulator is checked against a slow per-token reference written here from the
rules in the module docstring (same admission, same step formula, stalls noticed at step
boundaries), so the closed-form segment arithmetic has something independent to agree with.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from plexrl.errors import ConfigError
from plexrl.sim.experiments.workload import (
                                             DecodeModel, ToolCalls, ToolModel, sample_lengths, sample_tool_calls, simulate_rollout,
                                             )

GB = 1e9


def qwen3_30b_a3b(**overrides) -> DecodeModel:
    """30B-A3B on a TP2 instance of H800-class GPUs (CALIBRATION 4, 6.3)."""
    params = dict(tp=2, hbm_bytes_per_s=3.35e12, dense_weight_bytes=2 * 3.35 * GB,
                  all_weight_bytes=61.1 * GB, moe_saturation_batch=32,
                  kv_bytes_per_token=98_304, max_live_tokens=700_000,
                  prefill_tokens_per_s=0.5 * 989e12 * 2 / (2 * 3.35e9))
    params.update(overrides)
    return DecodeModel(**params)


def qwen25_7b(**overrides) -> DecodeModel:
    """Dense 7B on one GPU (TP1)."""
    params = dict(tp=1, hbm_bytes_per_s=3.35e12, dense_weight_bytes=15.2 * GB,
                  all_weight_bytes=15.2 * GB, kv_bytes_per_token=57_344,
                  max_live_tokens=870_000, prefill_tokens_per_s=0.5 * 989e12 / (2 * 7.6e9))
    params.update(overrides)
    return DecodeModel(**params)


# ----------------------------------------------------------------------------- decode model

def test_step_s_matches_hand_computed_value():
    decode = qwen3_30b_a3b()
    # batch 1 reads the active path only: (6.7e9 + 1000 * 98,304) / 2 GPUs = 3.399152e9 B
    # per GPU, at 3.35e12 * 0.75 = 2.5125e12 B/s -> 1.35289632 ms, plus t0 = 3 ms.
    assert decode.step_s(1, 1000) == pytest.approx(0.00435289632, rel=1e-9)
    # batch 32 touches every expert: 61.1e9 / 2 / 2.5125e12 = 12.1592 ms, plus 3 ms.
    assert decode.step_s(32, 0) == pytest.approx(0.01515920398, rel=1e-9)


def test_moe_weight_read_interpolates_between_active_and_all_experts():
    decode = qwen3_30b_a3b()
    dense, all_bytes = decode.dense_weight_bytes, decode.all_weight_bytes
    assert decode.weight_read_bytes(1) == dense
    assert decode.weight_read_bytes(16.5) == pytest.approx((dense + all_bytes) / 2)
    assert decode.weight_read_bytes(9) == pytest.approx(dense + (all_bytes - dense) * 8 / 31)
    assert decode.weight_read_bytes(32) == pytest.approx(all_bytes)
    assert decode.weight_read_bytes(500) == pytest.approx(all_bytes)
    steps = [decode.step_s(b, 0) for b in range(1, 40)]
    assert steps == sorted(steps) and steps[-1] == steps[31]


def test_dense_model_reads_the_same_weights_at_any_batch():
    decode = qwen25_7b()
    assert decode.weight_read_bytes(1) == decode.weight_read_bytes(400) == 15.2 * GB


def test_steps_s_is_the_sum_of_its_steps():
    decode = qwen3_30b_a3b()
    batch, context = 7, 12_345
    by_step = sum(decode.step_s(batch, context + batch * i) for i in range(300))
    assert decode.steps_s(batch, context, 300) == pytest.approx(by_step, rel=1e-12)


def test_peak_tokens_per_s_fills_the_kv_capacity():
    decode = qwen3_30b_a3b()
    batch = 700_000 // 3_500                      # 200 sequences of 3,500 tokens
    step_s = 0.003 + (61.1e9 + 700_000 * 98_304) / 2 / 2.5125e12
    assert decode.peak_tokens_per_s(3_500) == pytest.approx(batch / step_s)
    assert 2_000 < decode.peak_tokens_per_s(3_500) / decode.tp < 5_000   # CALIBRATION 6.3


def test_bad_decode_model_is_a_config_error():
    with pytest.raises(ConfigError):
        qwen3_30b_a3b(all_weight_bytes=1.0)
    with pytest.raises(ConfigError):
        qwen3_30b_a3b(eta=0.0)


# ----------------------------------------------------------------------------- draws

def test_lengths_match_the_7b_table():
    lengths = sample_lengths(np.random.default_rng(7), 200_000, 700, 0.9, 8192)
    assert lengths.min() >= 1 and lengths.max() == 8192 and lengths.dtype == np.int64
    assert lengths.mean() == pytest.approx(1_040, rel=0.03)
    assert np.quantile(lengths, 0.5) == pytest.approx(700, rel=0.03)
    assert np.quantile(lengths, 0.9) == pytest.approx(2_210, rel=0.03)
    assert np.quantile(lengths, 0.99) == pytest.approx(5_690, rel=0.03)
    assert 0.0025 < (lengths == 8192).mean() < 0.0037      # 0.3 %; lognormal tail 0.31 %


def test_tool_calls_are_poisson_with_lognormal_latencies():
    calls = sample_tool_calls(np.random.default_rng(3), 50_000, ToolModel(4.0, 0.16, 1.2))
    assert calls.num_calls.mean() == pytest.approx(4.0, rel=0.02)
    assert calls.num_calls.var() == pytest.approx(4.0, rel=0.05)
    assert np.median(calls.latency_s) == pytest.approx(0.16, rel=0.03)
    assert len(calls.latencies_of(5)) == calls.num_calls[5]


def test_no_tools_draws_nothing():
    rng = np.random.default_rng(11)
    calls = sample_tool_calls(rng, 10, None)
    assert calls.num_calls.sum() == 0 and calls.latency_s.size == 0
    assert rng.random() == np.random.default_rng(11).random()


# ----------------------------------------------------------------------------- reference

def _segments(length: int, num_calls: int) -> list[int]:
    parts = min(num_calls, length - 1) + 1
    return [len(part) for part in np.array_split(np.arange(length), parts)]


class _Reference:
    """One instance, one decode step per loop turn: the rules of the module docstring."""

    def __init__(self, lengths, prompt_tokens, decode, calls_of):
        num = len(lengths)
        self.lengths, self.prompt_tokens, self.decode = lengths, prompt_tokens, decode
        self.calls_of = calls_of
        self.segments = [_segments(int(n), len(calls_of(i))) for i, n in enumerate(lengths)]
        self.seg, self.left = [0] * num, [0] * num
        self.context, self.end = [prompt_tokens] * num, [0.0] * num
        self.stall_start, self.stall_end = {}, {}
        self.queue, self.live, self.stalled = deque(range(num)), set(), set()
        self.now = self.busy = self.stall = 0.0
        self.reserved = self.tokens = 0

    def run(self):
        while self.queue or self.live:
            self.admit()
            for i in sorted(self.stalled):
                if self.stall_end[i] <= self.now:
                    self.stalled.discard(i)
                    self.stall += self.now - self.stall_start[i]
            decoding = sorted(self.live - self.stalled)
            if decoding:
                self.step(decoding)
            elif self.live:
                self.now = min(self.stall_end[i] for i in self.stalled)
        return self

    def admit(self):
        while self.queue and (not self.live or self.reserved + self.prompt_tokens
                              + self.lengths[self.queue[0]] <= self.decode.max_live_tokens):
            i = self.queue.popleft()
            self.live.add(i)
            self.reserved += self.prompt_tokens + int(self.lengths[i])
            self.left[i] = self.segments[i][0]
            self.now += self.prompt_tokens / self.decode.prefill_tokens_per_s
            self.busy += self.prompt_tokens / self.decode.prefill_tokens_per_s

    def step(self, decoding):
        step_s = self.decode.step_s(len(decoding), sum(self.context[i] for i in decoding))
        self.now += step_s
        self.busy += step_s
        for i in decoding:
            self.context[i] += 1
            self.left[i] -= 1
            self.tokens += 1
            if self.left[i] == 0:
                self.end_segment(i)

    def end_segment(self, i):
        if self.seg[i] + 1 == len(self.segments[i]):
            self.live.discard(i)
            self.reserved -= self.prompt_tokens + int(self.lengths[i])
            self.end[i] = self.now
            return
        self.stalled.add(i)
        self.stall_start[i] = self.now
        self.stall_end[i] = self.now + self.calls_of(i)[self.seg[i]]
        self.seg[i] += 1
        self.left[i] = self.segments[i][self.seg[i]]


def _reference_rollout(lengths, prompt_tokens, num_instances, decode, calls: ToolCalls):
    result = {"busy": [], "end": [], "tokens": 0, "stall": 0.0, "sample_end": []}
    indices = np.array_split(np.arange(len(lengths)), num_instances)
    for chunk in indices:
        ref = _Reference(lengths[chunk], prompt_tokens, decode,
                         lambda i, c=chunk: calls.latencies_of(c[i])).run()
        result["busy"].append(ref.busy)
        result["end"].append(max(ref.end, default=0.0))
        result["tokens"] += ref.tokens
        result["stall"] += ref.stall
        result["sample_end"].extend(ref.end)
    return result


def _solo_decode_s(length: int, prompt_tokens: int, decode: DecodeModel) -> float:
    """A sample alone on an instance: its prefill and one batch-1 step per token."""
    return (prompt_tokens / decode.prefill_tokens_per_s
            + sum(decode.step_s(1, prompt_tokens + i) for i in range(length)))


# ----------------------------------------------------------------------------- rollout

def test_single_sample_makespan_is_the_sum_of_its_steps():
    decode = qwen3_30b_a3b()
    result = simulate_rollout(np.array([3_000]), 400, 1, decode, np.random.default_rng(0))
    assert result.makespan_s == pytest.approx(_solo_decode_s(3_000, 400, decode), rel=1e-9)
    assert result.instance_busy_s == pytest.approx((result.makespan_s,))
    assert result.decode_tokens == 3_000 and result.stall_s == 0


def test_tokens_are_conserved():
    lengths = sample_lengths(np.random.default_rng(1), 1_024, 700, 0.9, 8_192)
    for tool in (None, ToolModel(2.0, 0.2, 1.0)):
        result = simulate_rollout(lengths, 300, 8, qwen25_7b(), np.random.default_rng(2), tool)
        assert result.decode_tokens == int(lengths.sum())
        assert len(result.instance_busy_s) == len(result.instance_end_s) == 8
        assert max(result.sample_end_s) == result.makespan_s == max(result.instance_end_s)


def test_more_instances_never_slow_an_ample_batch_but_idle_more():
    lengths = sample_lengths(np.random.default_rng(5), 64, 700, 0.9, 8_192)
    results = [simulate_rollout(lengths, 300, n, qwen25_7b(), np.random.default_rng(0))
               for n in (1, 2, 4, 8, 16, 32, 64)]
    makespans = [r.makespan_s for r in results]
    assert makespans == sorted(makespans, reverse=True)
    assert makespans[-1] < makespans[0]     # weight reads dominate: the tail sample decides
    assert results[0].busy_frac == pytest.approx(1.0)
    assert results[-1].busy_frac < results[2].busy_frac < results[0].busy_frac


def test_kv_cap_serialises_the_batch_and_takes_longer():
    lengths = sample_lengths(np.random.default_rng(9), 32, 700, 0.9, 8_192)
    ample = simulate_rollout(lengths, 300, 1, qwen25_7b(), np.random.default_rng(0))
    capped_decode = qwen25_7b(max_live_tokens=300 + int(lengths.max()))
    capped = simulate_rollout(lengths, 300, 1, capped_decode, np.random.default_rng(0))
    assert capped.makespan_s > 2 * ample.makespan_s
    assert capped.decode_tokens == ample.decode_tokens


def test_reservations_may_fill_the_capacity_exactly():
    lengths, no_tools = np.array([100, 100]), sample_tool_calls(None, 2, None)
    for max_live_tokens, concurrent in ((300, True), (299, False)):
        decode = qwen25_7b(max_live_tokens=max_live_tokens)
        got = simulate_rollout(lengths, 50, 1, decode, np.random.default_rng(0))
        want = _reference_rollout(lengths, 50, 1, decode, no_tools)
        assert got.makespan_s == pytest.approx(want["end"][0], rel=1e-9)
        serial_s = 2 * _solo_decode_s(100, 50, decode)
        assert (got.makespan_s < serial_s) == concurrent


def test_a_sample_larger_than_the_capacity_runs_alone():
    decode = qwen25_7b(max_live_tokens=100)
    result = simulate_rollout(np.array([500, 20]), 50, 1, decode, np.random.default_rng(0))
    first = _solo_decode_s(500, 50, decode)
    assert result.sample_end_s[0] == pytest.approx(first, rel=1e-9)
    assert result.makespan_s == pytest.approx(first + _solo_decode_s(20, 50, decode), rel=1e-9)


def test_tool_stalls_add_their_latency_to_a_lone_sample():
    decode, tool = qwen3_30b_a3b(), ToolModel(3.0, 0.5, 0.8)
    latency_s = sample_tool_calls(np.random.default_rng(4), 1, tool).latency_s
    result = simulate_rollout(np.array([2_000]), 200, 1, decode, np.random.default_rng(4), tool)
    assert latency_s.size > 0
    expected = _solo_decode_s(2_000, 200, decode) + latency_s.sum()
    assert result.makespan_s == pytest.approx(expected, rel=1e-9)
    assert result.stall_s == pytest.approx(latency_s.sum(), rel=1e-9)
    assert sum(result.instance_busy_s) == pytest.approx(expected - latency_s.sum(), rel=1e-9)


def test_calls_are_capped_so_no_segment_is_empty():
    decode, tool = qwen25_7b(), ToolModel(20.0, 0.5, 0.5)
    calls = sample_tool_calls(np.random.default_rng(13), 1, tool)
    result = simulate_rollout(np.array([3]), 10, 1, decode, np.random.default_rng(13), tool)
    assert calls.num_calls[0] > 2                 # three tokens leave room for two calls
    expected = _solo_decode_s(3, 10, decode) + calls.latency_s[:2].sum()
    assert result.makespan_s == pytest.approx(expected, rel=1e-9)


def test_tool_stalls_delay_each_sample_by_at_least_its_stall_sum():
    decode, tool = qwen25_7b(), ToolModel(2.0, 1.0, 1.0)
    lengths = np.random.default_rng(6).integers(100, 3_000, size=96)
    calls = sample_tool_calls(np.random.default_rng(8), len(lengths), tool)
    result = simulate_rollout(lengths, 300, 4, decode, np.random.default_rng(8), tool)
    stall_sum_s = np.array([calls.latencies_of(i).sum() for i in range(len(lengths))])
    solo_s = np.array([_solo_decode_s(int(n), 300, decode) for n in lengths])
    assert np.all(np.array(result.sample_end_s) >= solo_s + stall_sum_s)
    longest = int(np.argmax(stall_sum_s))
    assert result.makespan_s >= solo_s[longest] + stall_sum_s[longest]
    assert result.stall_s >= stall_sum_s.sum()


def test_same_seed_same_result():
    lengths = sample_lengths(np.random.default_rng(12), 256, 2_500, 0.8, 16_384)
    tool = ToolModel(4.0, 0.16, 1.2)
    runs = [simulate_rollout(lengths, 150, 8, qwen3_30b_a3b(), np.random.default_rng(s), tool)
            for s in (21, 21, 22)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]


def test_more_instances_than_samples_leave_some_idle():
    result = simulate_rollout(np.array([10, 20]), 5, 4, qwen25_7b(), np.random.default_rng(0))
    assert result.instance_end_s[2:] == (0.0, 0.0) and result.instance_busy_s[2:] == (0.0, 0.0)


@given(
    lengths=st.lists(st.integers(1, 6) | st.integers(1, 120), min_size=1, max_size=12),
    prompt_tokens=st.integers(0, 64),
    num_instances=st.integers(1, 4),
    max_live_tokens=st.integers(1, 1_500),
    moe_saturation_batch=st.sampled_from([1, 2, 5]),
    t0_s=st.floats(0.0, 0.005),
    kv_bytes_per_token=st.floats(0.0, 2e7),
    calls_mean=st.sampled_from([0.0, 0.5, 2.0, 4.0]),
    latency_median_s=st.floats(1e-4, 0.05),
    latency_sigma=st.floats(0.1, 1.5),
    seed=st.integers(0, 2**32 - 1),
)
def test_closed_form_matches_a_per_token_reference(lengths, prompt_tokens, num_instances,
                                                    max_live_tokens, moe_saturation_batch,
                                                    t0_s, kv_bytes_per_token, calls_mean,
                                                    latency_median_s, latency_sigma, seed):
    decode = DecodeModel(tp=2, t0_s=t0_s, hbm_bytes_per_s=1e12, dense_weight_bytes=1e9,
                         all_weight_bytes=4e9, moe_saturation_batch=moe_saturation_batch,
                         kv_bytes_per_token=kv_bytes_per_token, max_live_tokens=max_live_tokens,
                         prefill_tokens_per_s=20_000)
    tool = ToolModel(calls_mean, latency_median_s, latency_sigma)
    lengths = np.array(lengths, dtype=np.int64)
    calls = sample_tool_calls(np.random.default_rng(seed), len(lengths), tool)
    got = simulate_rollout(lengths, prompt_tokens, num_instances, decode,
                           np.random.default_rng(seed), tool)
    want = _reference_rollout(lengths, prompt_tokens, num_instances, decode, calls)
    assert got.decode_tokens == want["tokens"] == lengths.sum()
    assert got.makespan_s == pytest.approx(max(want["end"]), rel=1e-6)
    assert got.instance_end_s == pytest.approx(tuple(want["end"]), rel=1e-6)
    assert got.instance_busy_s == pytest.approx(tuple(want["busy"]), rel=1e-6)
    assert got.sample_end_s == pytest.approx(tuple(want["sample_end"]), rel=1e-6)
    assert got.stall_s == pytest.approx(want["stall"], rel=1e-6, abs=1e-12)


def test_a_paper_scale_rollout_conserves_tokens_and_keeps_instances_busy():
    # speed is measured in bench/, not here: this checks the paper-scale case behaves
    lengths = sample_lengths(np.random.default_rng(0), 4_096, 6_000, 0.6, 16_384)
    result = simulate_rollout(lengths, 300, 64, qwen3_30b_a3b(), np.random.default_rng(1))
    assert result.decode_tokens == int(lengths.sum())
    assert math.isfinite(result.makespan_s) and 0.5 < result.busy_frac <= 1.0
