"""The modelled driver of one RLVR job: the calls it issues, and what each really costs.

Owns: ``SimJob``, a state machine over training steps (GENERATE, reward on the CPU,
LOGPROBS of the policy and optionally of a reference model, FORWARD_BACKWARD, OPTIM_STEP,
SYNC_WEIGHTS) that honours the job's staleness s by version: GENERATE of step k samples
from version max(0, k - s), and SYNC_WEIGHTS(v) is issued only once GENERATE(v + s - 1) is,
so a sync never overtakes the rollout that must still use the older version. It also owns
the "truth" of each call's duration and useful GPU-seconds (the workload model, FLOPs at
the model's MFU). Must not know: the scheduler, tiers, or accounting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from plexrl.core.costs import FLOPS_PER_TOKEN
from plexrl.core.events import CallQueued
from plexrl.core.jobs import JobSpec, ModelDecl
from plexrl.core.snapshot import CallView
from plexrl.protocol import COPY_OF, CallId, Copy, Function, JobId, Role, WorkerGroupId, copy_id
from plexrl.sim.scenario import ClusterConfig, ModelConfig, WorkloadConfig
from plexrl.sim.experiments.workload import DecodeModel, RolloutResult, ToolModel, sample_lengths, simulate_rollout

MAX_STEPS_FACTOR = 50


@dataclass(frozen=True)
class CallCost:
    """What one call really took on its worker group."""

    duration_s: float
    useful_gpu_s: float          #: GPU-seconds of compute (busy instances, training kernels)


@dataclass
class StepLog:
    """Per-step times of one job, filled as the simulation runs."""

    decode_efficiency: list[float] = field(default_factory=list)
    step_end: list[float] = field(default_factory=list)


def decode_model(model: ModelConfig, cluster: ClusterConfig) -> DecodeModel:
    """The decode roofline of one rollout instance of ``model`` on ``cluster``'s GPUs."""
    spec = model.spec()
    weights = model.dtype_bytes * model.total_params
    kv_room = cluster.device_memory_bytes * cluster.usable_frac * model.rollout_tp - weights
    return DecodeModel(tp=model.rollout_tp, t0_s=model.decode_t0_s, eta=model.decode_eta,
                       hbm_bytes_per_s=cluster.hbm_bytes_per_s,
                       dense_weight_bytes=model.dtype_bytes * model.active_params,
                       all_weight_bytes=weights, moe_saturation_batch=model.moe_saturation_batch,
                       kv_bytes_per_token=spec.kv_bytes_per_token,
                       max_live_tokens=max(1, int(kv_room // spec.kv_bytes_per_token)),
                       prefill_tokens_per_s=model.prefill_tokens_per_s,
                       compute_s_per_token=2 * model.active_params / (
                           model.rollout_tp * cluster.peak_flops * model.decode_mfu))


class SimJob:
    """One job's driver program, as the simulator models it."""

    def __init__(self, job: JobId, workload: WorkloadConfig, model: ModelConfig,
                 cluster: ClusterConfig, *, staleness: int, num_steps: int, seed: int,
                 workspace_frac: float, lanes: int = 1):
        """``lanes``: the rollout copy's lanes; each step's batch is split over them, one
        GENERATE chunk per lane (every ``lanes``-th sequence), and a sync goes to each."""
        self.job, self.workload, self.model, self.cluster = job, workload, model, cluster
        self.lanes = lanes
        self.staleness, self.num_steps, self.workspace_frac = staleness, num_steps, workspace_frac
        self.max_steps = MAX_STEPS_FACTOR * num_steps  # a fast job steps on while a slow one finishes
        self.decode = decode_model(model, cluster)
        self.tool = (ToolModel(workload.tool_calls_mean, workload.tool_latency_median_s,
                               workload.tool_latency_sigma) if workload.tool_calls_mean else None)
        self._lengths_rng = np.random.default_rng([seed, 0])
        self._tools_rng = np.random.default_rng([seed, 1])
        self._lengths: dict[int, np.ndarray] = {}
        self._seq: dict[tuple, int] = {}   # per copy_id
        self.log = StepLog()
        self.generated = 0        # GENERATE calls issued
        self.generate_done = 0    # steps whose every GENERATE chunk finished
        self._chunks_done: dict[int, int] = {}
        self.synced = 0           # highest version a SYNC_WEIGHTS was issued for
        self.trained = 0          # OPTIM_STEPs finished (= trainer weight version)
        #: rollouts already simulated, shared by runs that may reuse them: see _rollout_cost
        self.rollout_memo: dict | None = None

    # -- what the job declares ------------------------------------------------------------
    def spec(self, rollout_wgs: tuple[WorkerGroupId, ...], train_wgs: tuple[WorkerGroupId, ...]) -> JobSpec:
        models = [ModelDecl(Role.POLICY, self.model.spec(), (Copy.TRAINER, Copy.ROLLOUT))]
        candidates = [(Role.POLICY, Copy.TRAINER, train_wgs), (Role.POLICY, Copy.ROLLOUT, rollout_wgs)]
        if self.workload.reference_model:
            models.append(ModelDecl(Role.REFERENCE, self.model.spec(trainable=False)))
            candidates.append((Role.REFERENCE, Copy.TRAINER, train_wgs))
        return JobSpec(job=self.job, models=tuple(models), candidates=tuple(candidates),
                       staleness=self.staleness, rollout_lanes=self.lanes)

    # -- the driver's state machine -------------------------------------------------------
    def advance(self, now: float, next_call: Callable[[], CallId]) -> list[CallQueued]:
        """Calls that became issuable: syncs the rollout may take, then the next rollout."""
        out = []
        while True:
            issued = self._maybe_sync(now, next_call) or self._maybe_generate(now, next_call)
            if not issued:
                return out
            out += issued

    def _maybe_sync(self, now, next_call) -> list[CallQueued]:
        version = self.synced + 1
        if version > self.trained or self.generated < version + self.staleness:
            return []
        self.synced = version
        return [self._call(Function.SYNC_WEIGHTS, Role.POLICY, now, next_call, step=version - 1,
                           version=version, lane=lane) for lane in range(self.lanes)]

    def _maybe_generate(self, now, next_call) -> list[CallQueued]:
        k = self.generated
        want = max(0, k - self.staleness)
        if k >= self.max_steps or self.generate_done < k or self.synced < want:
            return []
        self.generated += 1
        return [self._call(Function.GENERATE, Role.POLICY, now, next_call, step=k, version=want,
                           num_tokens=int(self.chunk(k, lane).sum()), lane=lane)
                for lane in range(self.lanes)]

    def on_generated(self, step: int) -> bool:
        """A GENERATE chunk of ``step`` finished; True when it was the step's last."""
        self._chunks_done[step] = self._chunks_done.get(step, 0) + 1
        if self._chunks_done[step] < self.lanes:
            return False
        del self._chunks_done[step]
        self.generate_done = step + 1
        return True

    def training_calls(self, step: int, now: float, next_call, device_budget: float) -> list[CallQueued]:
        """After the reward of step ``step``: the trainer copy's calls for its batch, in order."""
        tokens = int(self.lengths(step).sum()) + self.batch_size * self.workload.prompt_tokens
        workspace = int(self.workspace_frac * device_budget)
        plan = [(Function.LOGPROBS, Role.POLICY)]
        if self.workload.reference_model:
            plan.append((Function.LOGPROBS, Role.REFERENCE))
        plan += [(Function.FORWARD_BACKWARD, Role.POLICY), (Function.OPTIM_STEP, Role.POLICY)]
        return [self._call(fn, role, now, next_call, step=step, num_tokens=tokens,
                           workspace_bytes=workspace) for fn, role in plan]

    def on_trained(self, now: float) -> None:
        self.trained += 1
        self.log.step_end.append(now)

    @property
    def done(self) -> bool:
        """Has the job its ``num_steps``? It keeps stepping until every job of the run has."""
        return self.trained >= self.num_steps

    # -- the truth of each call -----------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return self.workload.prompts_per_step * self.workload.group_size

    def lengths(self, step: int) -> np.ndarray:
        """Response lengths of a step's batch, drawn in step order from the job's own stream."""
        while len(self._lengths) <= step:
            k = len(self._lengths)
            median = self.workload.length_median * (1 + self.workload.length_drift_per_step) ** k
            self._lengths[k] = sample_lengths(self._lengths_rng, self.batch_size, median,
                                              self.workload.length_sigma,
                                              self.workload.max_response_tokens)
        return self._lengths[step]

    def chunk(self, step: int, lane: int) -> np.ndarray:
        """The response lengths of one lane's chunk of a step: every ``lanes``-th sequence."""
        return self.lengths(step)[lane::self.lanes]

    def cost(self, call: CallView, num_devices: int, colocated: bool) -> CallCost:
        """How long a call really takes on a group of ``num_devices`` GPUs, and its useful work."""
        if call.function == Function.GENERATE:
            return self._rollout_cost(call.step, num_devices, call.lane)
        if call.function in FLOPS_PER_TOKEN:
            flops = FLOPS_PER_TOKEN[call.function] * self.model.active_params * call.num_tokens
            seconds = flops / (self.model.mfu * self.cluster.peak_flops * num_devices)
            return CallCost(seconds, seconds * num_devices)
        if call.function == Function.OPTIM_STEP:
            return CallCost(self.model.optimizer_step_s, self.model.optimizer_step_s * num_devices)
        sync_s = self.model.colocated_sync_s if colocated else self.model.weight_sync_s
        return CallCost(sync_s, 0.0)

    def _rollout_cost(self, step: int, num_devices: int, lane: int = 0) -> CallCost:
        """One rollout, simulated (``simulate_rollout``), or taken from ``rollout_memo``.

        A job's rollouts run in step order and draw tool latencies from the job's own
        stream, so rollout k is the same in every run of the same job (id, workload but its
        reward_s, model, cluster, seed) on as many devices. The memo maps (job, devices,
        step) to the cost, the decode efficiency and the stream's state after the rollout,
        restored on a hit so a later miss draws what it would have. Whoever shares one memo
        between runs vouches that they differ in nothing else (plexrl/sim/experiments/queue_study.py).
        """
        key = (self.job, num_devices, step, lane, self.lanes)
        if self.rollout_memo is not None and key in self.rollout_memo:
            cost, efficiency, state = self.rollout_memo[key]
            self._tools_rng.bit_generator.state = state
            self.log.decode_efficiency.append(efficiency)
            return cost
        cost = self._simulate_rollout(step, num_devices, lane)
        if self.rollout_memo is not None:
            self.rollout_memo[key] = (cost, self.log.decode_efficiency[-1],
                                      self._tools_rng.bit_generator.state)
        return cost

    def _simulate_rollout(self, step: int, num_devices: int, lane: int) -> CallCost:
        instances = max(1, num_devices // self.model.rollout_tp)
        lengths = self.chunk(step, lane)
        result: RolloutResult = simulate_rollout(lengths, self.workload.prompt_tokens, instances,
                                                 self.decode, self._tools_rng, self.tool)
        mean_ctx = self.workload.prompt_tokens + float(lengths.mean()) / 2
        peak = instances * self.decode.peak_tokens_per_s(mean_ctx)
        useful = sum(result.instance_busy_s) * self.model.rollout_tp
        self.log.decode_efficiency.append(result.decode_tokens / (result.makespan_s * peak))
        return CallCost(result.makespan_s, useful)

    def _call(self, function: Function, role: Role, now: float, next_call, *, step: int,
              version: int = 0, num_tokens: int = 0, workspace_bytes: int = 0,
              lane: int = 0) -> CallQueued:
        copy = copy_id(role, COPY_OF[function], lane)
        seq = self._seq.get(copy, 0)
        self._seq[copy] = seq + 1
        return CallQueued(call=next_call(), job=self.job, seq=seq, function=function, role=role,
                          at=now, step=step, num_tokens=num_tokens, version=version,
                          workspace_bytes=workspace_bytes, lane=lane)

