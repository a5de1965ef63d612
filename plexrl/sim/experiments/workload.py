"""The modelled work of one RLVR step: response lengths, rollout decoding and tool stalls.

Owns: drawing response lengths and tool calls from a seeded ``numpy.random.Generator``,
the per-instance decode cost (a roofline with a fixed overhead, CALIBRATION 6.3), and
``simulate_rollout``, which turns a batch of known lengths into seconds: the makespan,
each rollout instance's busy time and end, tokens decoded and tool-stall time.

Must not know: the scheduler (``core``), Tiers and Transitions (where weights live, what
a wake-up costs), or accounting (GPU-hours, bubble ratios). It returns seconds on a
virtual clock that starts at 0; the caller places them on its timeline and prices them.

How the model departs from reality (read before trusting a number):

1. Oracle KV reservation. A sample is admitted only if ``prompt_tokens`` plus its *final*
   length fits in the instance's free KV capacity (the simulator knows the length). Real
   engines reserve page by page, admit optimistically and preempt or recompute when KV
   runs out; that cost is not modelled. A sample larger than the whole capacity runs alone.
2. Admission is strict FIFO in the caller's order (no skipping a head that does not fit).
3. Prefill is serialised and pauses decoding: each admitted sample costs
   ``prompt_tokens / prefill_tokens_per_s``. No prefix cache across a group's shared prompt,
   no chunked prefill mixed into decode steps.
4. Decode is a memory-bound roofline: weights plus the KV of every decoding sample are read
   once per step; compute limits at very large batches, kernel inefficiency and sampling
   cost are folded into ``t0_s``, and the matmul time of the batch (``compute_s_per_token``) is
   added, not overlapped, so large batches saturate. MoE experts touched grow linearly with the batch up to
   ``moe_saturation_batch``.
5. Static data-parallel dispatch: the batch is cut into contiguous, near-equal chunks, one
   per instance (as verl dispatches DP chunks); no work stealing, migration or shared
   contention between instances.
6. Tool calls split a response into near-equal decode segments; a call's output tokens are
   not appended to the context (no re-prefill after a call); the number of calls is capped
   at ``length - 1`` so no segment is empty. A stall that ends while others decode is
   noticed at the next step boundary (at most one step late); when nothing else decodes
   the clock jumps to the stall's end exactly.
7. Lengths and tool calls are drawn independently per sample (real groups sharing a prompt
   have correlated lengths); calls per trajectory are Poisson (the Intern-S1 histogram is
   more peaked, mode 3), latencies lognormal and independent.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from plexrl.errors import ConfigError
from plexrl.protocol import shares

__all__ = [
    "DecodeModel", "ToolModel", "ToolCalls", "RolloutResult",
    "sample_lengths", "sample_tool_calls", "simulate_rollout",
]


@dataclass(frozen=True, kw_only=True)
class DecodeModel:
    """Per rollout instance (rollout_tp GPUs), roofline with a fixed overhead (CALIBRATION 6.3)."""

    tp: int                       # GPUs per instance
    t0_s: float = 0.003           # fixed cost per decode step
    eta: float = 0.75             # achieved fraction of HBM bandwidth
    hbm_bytes_per_s: float        # per GPU
    dense_weight_bytes: float     # active path read per step at batch 1 (dtype x active params)
    all_weight_bytes: float       # all weights (dtype x total params); MoE reads up to this
    moe_saturation_batch: int = 1  # live batch at which every expert is touched; 1 for dense
    kv_bytes_per_token: float     # whole model, K and V, all layers
    max_live_tokens: int          # KV capacity of one instance, tokens
    prefill_tokens_per_s: float   # per instance
    compute_s_per_token: float = 0.0  # s of matmul per sample per step (2 x active / (tp x FLOP/s))

    def __post_init__(self):
        positive = ("tp", "hbm_bytes_per_s", "dense_weight_bytes", "max_live_tokens",
                    "prefill_tokens_per_s", "moe_saturation_batch")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ConfigError("must be > 0", field=name, value=getattr(self, name))
        if not 0 < self.eta <= 1:
            raise ConfigError("must be in (0, 1]", field="eta", value=self.eta)
        if self.t0_s < 0 or self.kv_bytes_per_token < 0:
            raise ConfigError("must be >= 0", field="t0_s/kv_bytes_per_token",
                              value=(self.t0_s, self.kv_bytes_per_token))
        if self.all_weight_bytes < self.dense_weight_bytes:
            raise ConfigError("all_weight_bytes < dense_weight_bytes",
                              field="all_weight_bytes", value=self.all_weight_bytes,
                              fix="all weights include the active path")

    @property
    def read_bytes_per_s(self) -> float:
        """Achieved HBM bandwidth of one GPU."""
        return self.hbm_bytes_per_s * self.eta

    def weight_read_bytes(self, batch: float) -> float:
        """W(batch): weight bytes of the whole instance read by one step of ``batch`` samples."""
        if self.moe_saturation_batch <= 1:
            return self.dense_weight_bytes
        touched_frac = min(1.0, max(0.0, (batch - 1) / (self.moe_saturation_batch - 1)))
        return self.dense_weight_bytes + (
            self.all_weight_bytes - self.dense_weight_bytes) * touched_frac

    def step_s(self, batch: int, context_tokens: float) -> float:
        """One decode step of ``batch`` samples whose contexts sum to ``context_tokens``."""
        bytes_per_gpu = (self.weight_read_bytes(batch)
                         + context_tokens * self.kv_bytes_per_token) / self.tp
        return (self.t0_s + bytes_per_gpu / self.read_bytes_per_s
                + batch * self.compute_s_per_token)

    def steps_s(self, batch: int, context_tokens: float, num_steps: int) -> float:
        """``num_steps`` steps at a constant batch, each adding ``batch`` tokens of context."""
        growth_s = batch * self.kv_bytes_per_token / self.tp / self.read_bytes_per_s
        return (num_steps * self.step_s(batch, context_tokens)
                + growth_s * num_steps * (num_steps - 1) / 2)

    def prefill_s(self, prompt_tokens: int) -> float:
        """Prefill of one sample's prompt (decoding pauses meanwhile)."""
        return prompt_tokens / self.prefill_tokens_per_s

    def peak_tokens_per_s(self, mean_context_tokens: float) -> float:
        """Saturated output tokens/s of one instance: a batch filling ``max_live_tokens``."""
        if not mean_context_tokens > 0:
            raise ConfigError("must be > 0", field="mean_context_tokens",
                              value=mean_context_tokens)
        batch = max(1, int(self.max_live_tokens // mean_context_tokens))
        return batch / self.step_s(batch, batch * mean_context_tokens)


@dataclass(frozen=True)
class ToolModel:
    """Tool calls of a multi-turn trajectory (CALIBRATION 2.4, 6.2 agentic variant)."""

    calls_mean: float             # mean tool calls per trajectory (0 = single-turn)
    latency_median_s: float       # median latency of one call
    latency_sigma: float          # lognormal sigma of one call's latency

    def __post_init__(self):
        if self.calls_mean < 0 or self.latency_sigma < 0 or not self.latency_median_s > 0:
            raise ConfigError("need calls_mean >= 0, latency_median_s > 0, latency_sigma >= 0",
                              field="ToolModel", value=self)


@dataclass(frozen=True, eq=False)
class ToolCalls:
    """Drawn tool calls of a batch: counts per sample and their latencies, sample-major."""

    num_calls: np.ndarray         # int64, per sample
    latency_s: np.ndarray         # float64, num_calls.sum() latencies, sample by sample
    first_call: np.ndarray = field(init=False)  # index in latency_s of each sample's 1st call

    def __post_init__(self):
        starts = np.concatenate(([0], np.cumsum(self.num_calls)[:-1])).astype(np.int64)
        object.__setattr__(self, "first_call", starts[: len(self.num_calls)])

    def latencies_of(self, sample: int) -> np.ndarray:
        """Latencies of one sample's calls, in call order."""
        start = self.first_call[sample]
        return self.latency_s[start: start + self.num_calls[sample]]


@dataclass(frozen=True)
class RolloutResult:
    """What a rollout of one batch cost, on a clock that starts at 0."""

    makespan_s: float             # from start until the last sample of the batch finishes
    instance_busy_s: tuple[float, ...]  # per instance: s with >= 1 sequence decoding/prefilling
    instance_end_s: tuple[float, ...]   # per instance: time its last sample finished (0 if none)
    decode_tokens: int            # output tokens generated
    stall_s: float                # sample-seconds waiting on tools (until decoding resumes)
    sample_end_s: tuple[float, ...] = ()  # per sample, in the caller's order: when it finished

    @property
    def busy_frac(self) -> float:
        """Mean instance busy time over the makespan (the 'tail efficiency' of CALIBRATION 6.4)."""
        if not self.makespan_s:
            return 0.0
        return float(np.mean(self.instance_busy_s)) / self.makespan_s


def sample_lengths(rng: np.random.Generator, num: int, median: float, sigma: float,
                   max_tokens: int) -> np.ndarray:
    """Response lengths ~ lognormal(ln median, sigma), rounded up, in [1, max_tokens].

    A response that would pass ``max_tokens`` stops there (the cap of CALIBRATION 6.2).
    """
    raw = rng.lognormal(mean=math.log(median), sigma=sigma, size=num)
    return np.clip(np.ceil(raw), 1, max_tokens).astype(np.int64)


def sample_tool_calls(rng: np.random.Generator, num: int,
                      tool: ToolModel | None) -> ToolCalls:
    """Per-sample Poisson(``calls_mean``) calls, each with a lognormal latency.

    Draws nothing from ``rng`` when there are no tools, so a single-turn rollout leaves the
    generator untouched. Counts are drawn first, then all latencies in sample order.
    """
    if tool is None or tool.calls_mean == 0:
        return ToolCalls(np.zeros(num, np.int64), np.zeros(0))
    num_calls = rng.poisson(tool.calls_mean, size=num).astype(np.int64)
    latency_s = rng.lognormal(mean=math.log(tool.latency_median_s), sigma=tool.latency_sigma,
                              size=int(num_calls.sum()))
    return ToolCalls(num_calls, latency_s)


def _segment_tokens(length: np.ndarray, num_calls: np.ndarray,
                    segment: np.ndarray) -> np.ndarray:
    """Tokens of decode segment ``segment`` when ``length`` is split into num_calls+1 parts."""
    parts = num_calls + 1
    return length // parts + (segment < length % parts)


def _steps_until(decode: DecodeModel, batch: int, context_tokens: float,
                 wait_s: float, max_steps: int) -> int:
    """Smallest n in [1, max_steps] whose n steps take at least ``wait_s``, else max_steps."""
    if decode.steps_s(batch, context_tokens, max_steps) < wait_s:
        return max_steps                # the stall outlasts this run of steps
    first_s = decode.step_s(batch, context_tokens)
    growth_s = batch * decode.kv_bytes_per_token / decode.tp / decode.read_bytes_per_s
    lin = first_s - growth_s / 2
    if growth_s == 0:
        guess = wait_s / first_s
    else:  # growth/2 n^2 + lin n - wait = 0, in the form that does not cancel
        root = math.sqrt(lin * lin + 2 * growth_s * wait_s)
        guess = 2 * wait_s / (lin + root) if lin >= 0 else (root - lin) / growth_s
    num_steps = min(max_steps, max(1, math.ceil(guess)))
    while num_steps > 1 and decode.steps_s(batch, context_tokens, num_steps - 1) >= wait_s:
        num_steps -= 1
    while decode.steps_s(batch, context_tokens, num_steps) < wait_s:
        num_steps += 1
    return num_steps


_PENDING, _DECODING, _STALLED, _DONE = 0, 1, 2, 3


class _Instance:
    """Continuous batching of one contiguous chunk on one rollout instance."""

    def __init__(self, lengths: np.ndarray, prompt_tokens: int, decode: DecodeModel,
                 num_calls: np.ndarray, latency_s: np.ndarray):
        num = len(lengths)
        self.decode, self.prompt_tokens, self.lengths = decode, prompt_tokens, lengths
        self.num_calls = np.minimum(num_calls, np.maximum(lengths - 1, 0))
        self.latency_s = latency_s          # per sample, padded: [sample, call]
        self.reserve_tokens = lengths + prompt_tokens
        self.state = np.full(num, _PENDING, np.int8)
        self.segment = np.zeros(num, np.int64)
        self.segment_left = np.zeros(num, np.int64)
        self.context_tokens = np.full(num, prompt_tokens, np.int64)
        self.stall_start_s = np.zeros(num)
        self.stall_ends: list[tuple[float, int]] = []   # heap of (stall end s, sample)
        self.end_s = np.zeros(num)
        self.next_pending = self.num_live = self.reserved_tokens = self.decode_tokens = 0
        self.now_s = self.busy_s = self.stall_s = 0.0

    def run(self) -> _Instance:
        """Simulate until every sample of the chunk has finished."""
        while True:
            self._admit()
            self._resume_stalls()
            decoding = np.flatnonzero(self.state == _DECODING)
            if decoding.size:
                self._decode(decoding)
            elif self.num_live:             # everyone live waits on a tool: idle
                self.now_s = self.stall_ends[0][0]
            else:
                return self

    def _admit(self) -> None:
        """FIFO admission while reservations fit; each admission pays its prefill."""
        capacity = self.decode.max_live_tokens
        while self.next_pending < len(self.lengths):
            i = self.next_pending
            if self.num_live and self.reserved_tokens + self.reserve_tokens[i] > capacity:
                return
            self.state[i] = _DECODING
            self.segment_left[i] = _segment_tokens(self.lengths[i], self.num_calls[i], 0)
            self.reserved_tokens += int(self.reserve_tokens[i])
            self.num_live += 1
            self.next_pending += 1
            prefill_s = self.decode.prefill_s(self.prompt_tokens)
            self.now_s += prefill_s
            self.busy_s += prefill_s

    def _resume_stalls(self) -> None:
        """Stalls that ended by now decode again from this step boundary on."""
        ready = []
        while self.stall_ends and self.stall_ends[0][0] <= self.now_s:
            ready.append(heapq.heappop(self.stall_ends)[1])
        if ready:
            self.state[ready] = _DECODING
            self.stall_s += float((self.now_s - self.stall_start_s[ready]).sum())

    def _decode(self, decoding: np.ndarray) -> None:
        """Run the decoding batch, in closed form, up to the next event."""
        batch = decoding.size
        context_tokens = int(self.context_tokens[decoding].sum())
        num_steps = int(self.segment_left[decoding].min())
        if self.stall_ends:
            wait_s = self.stall_ends[0][0] - self.now_s
            num_steps = _steps_until(self.decode, batch, context_tokens, wait_s, num_steps)
        elapsed_s = self.decode.steps_s(batch, context_tokens, num_steps)
        self.now_s += elapsed_s
        self.busy_s += elapsed_s
        self.segment_left[decoding] -= num_steps
        self.context_tokens[decoding] += num_steps
        self.decode_tokens += batch * num_steps
        self._end_segments(decoding[self.segment_left[decoding] == 0])

    def _end_segments(self, ended: np.ndarray) -> None:
        """Samples whose segment ran out either finish or start a tool call."""
        if not ended.size:
            return
        last = self.segment[ended] == self.num_calls[ended]
        if last.all():
            self._finish(ended)
        else:
            self._finish(ended[last])
            self._call_tool(ended[~last])

    def _finish(self, done: np.ndarray) -> None:
        self.state[done] = _DONE
        self.end_s[done] = self.now_s
        self.reserved_tokens -= int(self.reserve_tokens[done].sum())
        self.num_live -= done.size

    def _call_tool(self, calling: np.ndarray) -> None:
        """Stall until the call returns, holding the KV reservation; queue the next segment."""
        self.state[calling] = _STALLED
        self.stall_start_s[calling] = self.now_s
        stall_end_s = self.now_s + self.latency_s[calling, self.segment[calling]]
        for sample, end_s in zip(calling.tolist(), stall_end_s.tolist()):
            heapq.heappush(self.stall_ends, (end_s, sample))
        self.segment[calling] += 1
        self.segment_left[calling] = _segment_tokens(
            self.lengths[calling], self.num_calls[calling], self.segment[calling])


def _padded_latencies(calls: ToolCalls, start: int, stop: int) -> np.ndarray:
    """Latencies of samples [start, stop) as a [sample, call] matrix (0 where no call)."""
    num_calls = calls.num_calls[start:stop]
    width = int(num_calls.max()) if len(num_calls) else 0
    padded = np.zeros((len(num_calls), max(width, 1)))
    for row, sample in enumerate(range(start, stop)):
        padded[row, : num_calls[row]] = calls.latencies_of(sample)
    return padded


def _check_rollout_args(lengths: np.ndarray, prompt_tokens: int, num_instances: int) -> None:
    if lengths.ndim != 1 or (lengths.size and lengths.min() < 1):
        raise ConfigError("lengths must be a 1-D array of token counts >= 1",
                          field="lengths", value=lengths.shape)
    if prompt_tokens < 0 or num_instances < 1:
        raise ConfigError("need prompt_tokens >= 0 and num_instances >= 1",
                          field="prompt_tokens/num_instances", value=(prompt_tokens,
                                                                      num_instances))


def simulate_rollout(lengths: np.ndarray, prompt_tokens: int, num_instances: int,
                     decode: DecodeModel, rng: np.random.Generator,
                     tool: ToolModel | None = None) -> RolloutResult:
    """Decode a batch whose final lengths are known, on ``num_instances`` instances.

    ``lengths`` is in group order (the G samples of a prompt adjacent). Tool calls are drawn
    first, by ``sample_tool_calls(rng, len(lengths), tool)``; nothing else uses ``rng``.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    _check_rollout_args(lengths, prompt_tokens, num_instances)
    calls = sample_tool_calls(rng, len(lengths), tool)
    busy_s, end_s, sample_end_s = [], [], np.zeros(len(lengths))
    decode_tokens, stall_s = 0, 0.0
    for start, stop in shares(len(lengths), num_instances):
        run = _Instance(lengths[start:stop], prompt_tokens, decode,
                        calls.num_calls[start:stop],
                        _padded_latencies(calls, start, stop)).run()
        busy_s.append(run.busy_s)
        end_s.append(float(run.end_s.max()) if stop > start else 0.0)
        sample_end_s[start:stop] = run.end_s
        decode_tokens += run.decode_tokens
        stall_s += run.stall_s
    return RolloutResult(makespan_s=max(end_s), instance_busy_s=tuple(busy_s),
                         instance_end_s=tuple(end_s), decode_tokens=decode_tokens,
                         stall_s=stall_s, sample_end_s=tuple(sample_end_s.tolist()))
