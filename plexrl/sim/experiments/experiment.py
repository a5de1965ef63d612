"""One experiment in one mode: simulate, charge, measure; and the sizing search.

Owns: ``run_mode`` (simulate a layout, charge GPU-seconds in the measurement window, and
derive per job: GPU-hours per step, step time, bubble share, decode efficiency, slowdown
against the same job run alone in the same mode and sizes), ``search`` (every mode gets the
same search over its size choices, minimising mean GPU-hours per step), and the core's own
rollout-pool estimate for plexrl modes. Must not know: output formats.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from plexrl.core.placement import RolloutDemand, size_rollout_pool
from plexrl.core.snapshot import CoreConfig
from plexrl.errors import ConfigError
from plexrl.core.costs import FLOPS_PER_TOKEN
from plexrl.protocol import Function, JobId
from plexrl.sim.experiments.accounting import charge, measurement_window
from plexrl.sim.experiments.job import decode_model
from plexrl.sim.experiments.loop import Simulation, Trace
from plexrl.sim.experiments.modes import FLEET_MODES, Layout, Sizes, build_layout, fleet_group_gpus, fleet_tenants
from plexrl.sim.scenario import Scenario, SizesConfig


@dataclass(frozen=True)
class JobResult:
    gpu_hours_per_step: float
    useful_gpu_hours_per_step: float
    step_s: float
    bubble_frac: float
    decode_efficiency: float
    slowdown: float


@dataclass(frozen=True)
class ModeResult:
    mode: str
    sizes: dict[str, int]
    jobs: dict[JobId, JobResult]
    charged_gpu_s: float           #: sum over jobs, in the window
    allocated_gpu_s: float         #: sum over pools, in the window
    trace: Trace
    chosen: Sizes                  #: the sizes it ran at

    def mean(self, name: str) -> float:
        return float(np.mean([getattr(j, name) for j in self.jobs.values()]))


def core_config(s: Scenario) -> CoreConfig:
    return CoreConfig(queue_policy=s.queue_policy, prefetch=s.prefetch)


def simulate(s: Scenario, layout: Layout) -> Trace:
    sim = Simulation(layout.cluster, core_config(s), layout.jobs, layout.specs,
                     layout.achieved_bytes_per_s)
    return sim.run()


def run_mode(s: Scenario, mode: str, workloads: tuple[str, ...], sizes: Sizes, seed: int,
             with_alone: bool = True) -> ModeResult:
    layout = build_layout(s, mode, workloads, sizes, seed)
    trace = simulate(s, layout)
    ends = {job: sim_job.log.step_end for job, sim_job in layout.jobs.items()}
    try:
        window = measurement_window(ends, s.warmup_steps)
    except ValueError as err:
        raise ConfigError(str(err), file=s.source, field="num_steps", value=s.num_steps,
                          fix=f"simulate more steps than warmup_steps ({s.warmup_steps}) + 2") from None
    devices = {wg: spec.num_devices for wg, spec in layout.cluster.worker_groups.items()}
    bound = {wg: jobs or trace.bound.get(wg, []) for wg, jobs in layout.bound.items()}
    charges = charge(trace, devices, bound, ends, window)
    jobs = {}
    for job, sim_job in layout.jobs.items():
        steps = charges.steps[job]
        step_s = _step_s(ends[job], s.warmup_steps, s.num_steps)
        jobs[job] = JobResult(
            gpu_hours_per_step=charges.charged[job] / steps / 3600,
            useful_gpu_hours_per_step=charges.useful[job] / steps / 3600,
            step_s=step_s,
            bubble_frac=1 - charges.useful[job] / charges.charged[job],
            decode_efficiency=float(np.mean(sim_job.log.decode_efficiency[
                s.warmup_steps * sim_job.lanes:s.num_steps * sim_job.lanes])),
            slowdown=1.0)
    result = ModeResult(mode, resolved_sizes(s, mode, workloads, sizes), jobs, sum(charges.charged.values()),
                        sum(charges.allocated.values()), trace, sizes)
    return with_slowdowns(s, result, workloads, seed) if with_alone else result


def resolved_sizes(s: Scenario, mode: str, workloads: tuple[str, ...], sizes: Sizes) -> dict[str, int]:
    """The sizes a mode ran at, its defaults (0) replaced by what they stand for."""
    out = sizes.of(mode)
    if mode in FLEET_MODES:
        out["fleet_group_gpus"] = fleet_group_gpus(s, workloads, sizes)
        out["fleet_tenants"] = fleet_tenants(sizes, len(workloads))
    return out


def with_slowdowns(s: Scenario, result: ModeResult, workloads: tuple[str, ...], seed: int) -> ModeResult:
    """``result`` with each job's slowdown against the same job run alone at the same sizes."""
    return slowed(result, alone_step_s(s, result.mode, workloads, result.chosen, seed))


def slowed(result: ModeResult, alone: dict[JobId, float]) -> ModeResult:
    """``result`` with each job's slowdown against its step time alone, ``alone[job]``."""
    jobs = {job: replace(r, slowdown=r.step_s / alone[job]) for job, r in result.jobs.items()}
    return replace(result, jobs=jobs)


def _step_s(ends: list[float], warmup_steps: int, num_steps: int) -> float:
    """Mean time of the measured steps (after warm-up, up to ``num_steps``)."""
    return (ends[num_steps - 1] - ends[warmup_steps - 1]) / (num_steps - warmup_steps)


def alone_step_s(s: Scenario, mode: str, workloads: tuple[str, ...], sizes: Sizes,
                  seed: int) -> dict[JobId, float]:
    """Each job's step time with the same mode and sizes but no other job on its pools."""
    out = {}
    for index, name in enumerate(workloads):
        layout = build_layout(s, mode, (name,), sizes, seed, indexes=(index,))
        simulate(s, layout)
        for job, sim_job in layout.jobs.items():
            out[job] = _step_s(sim_job.log.step_end, s.warmup_steps, s.num_steps)
    return out


def fixed_sizes(table: SizesConfig) -> Sizes:
    """CALIBRATION 6.4's sizes; the fleet modes' default share is the private pool's."""
    return Sizes(table.colocated_gpus, table.split_rollout_gpus, table.train_gpus,
                 table.plexrl_private_gpus, table.fleet_gpus or table.plexrl_private_gpus,
                 table.fleet_group_gpus, table.train_gpus)


def candidates(s: Scenario, mode: str, table: SizesConfig, workloads: tuple[str, ...]) -> list[Sizes]:
    """Sizes the search tries for a mode: the fixed size and every listed choice."""
    base = fixed_sizes(table)
    if mode in FLEET_MODES:   # the fleet's share and the training pool, searched together
        trains = sorted({table.train_gpus, table.train_gpus * len(workloads),
                         *table.shared_train_choices})
        fleets = sorted({base.fleet_gpus, *table.fleet_choices})
        tenants = [0, *(n for n in (1, 2) if n < len(workloads))]   # 0: every job per group
        return [replace(base, fleet_gpus=f, shared_train_gpus=t, fleet_tenants=n)
                for f in fleets for t in trains for n in tenants]
    if mode == "colocated":
        values, name = table.colocated_choices, "colocated_gpus"
    elif mode == "split-async":
        values, name = table.split_rollout_choices, "split_rollout_gpus"
    else:
        values = table.plexrl_private_choices + (core_private_gpus(s, workloads, mode, table),)
        name = "plexrl_private_gpus"
    chosen = sorted({getattr(base, name), *values})
    return [replace(base, **{name: v}) for v in chosen]


def try_sizes(s: Scenario, mode: str, workloads: tuple[str, ...]) -> list[Sizes]:
    """Every size the search tries (only the fixed one without a search)."""
    table = s.sizes[s.workloads[workloads[0]].model]
    return candidates(s, mode, table, workloads) if s.search_sizes else [fixed_sizes(table)]


def tried_sizes(s: Scenario, mode: str, workloads: tuple[str, ...], seed: int) -> dict[Sizes, ModeResult]:
    """Every size the search tries, run, without slowdowns."""
    return {sz: run_mode(s, mode, workloads, sz, seed, with_alone=False)
            for sz in try_sizes(s, mode, workloads)}


def cheapest(tried: dict[Sizes, ModeResult]) -> ModeResult:
    """The result with the fewest mean GPU-hours per step (ties: by sizes, deterministically)."""
    return min(tried.values(), key=lambda r: (r.mean("gpu_hours_per_step"), str(r.chosen)))


def search(s: Scenario, mode: str, workloads: tuple[str, ...], seed: int,
           with_alone: bool = True) -> ModeResult:
    """The mode at its cheapest size (mean GPU-hours per step), slowdowns measured there;
    with ``max_slowdown``, the cheapest size that keeps every job within it."""
    tried = tried_sizes(s, mode, workloads, seed)
    best = cheapest(tried)
    if not with_alone:
        return best
    return within_slowdown(s, tried, workloads, seed, with_slowdowns(s, best, workloads, seed))


def worst_slowdown(result: ModeResult) -> float:
    return max(r.slowdown for r in result.jobs.values())


def within_slowdown(s: Scenario, tried: dict[Sizes, ModeResult], workloads: tuple[str, ...],
                    seed: int, first: ModeResult) -> ModeResult:
    """``first`` (the cheapest size, slowdowns measured) if no job's slowdown exceeds the
    scenario's ``max_slowdown`` (0: no bound); else the next cheapest size that keeps every
    job within it, measured in turn; if none does, the size with the smallest worst slowdown."""
    bound = s.max_slowdown
    if not bound or worst_slowdown(first) <= bound:
        return first
    best = first
    for result in sorted(tried.values(), key=lambda r: (r.mean("gpu_hours_per_step"), str(r.chosen))):
        if result.chosen == first.chosen:
            continue
        measured = with_slowdowns(s, result, workloads, seed)
        if worst_slowdown(measured) <= bound:
            return measured
        best = min(best, measured, key=worst_slowdown)
    return best


def core_private_gpus(s: Scenario, workloads: tuple[str, ...], mode: str, table: SizesConfig) -> int:
    """The core placement's choice of private rollout GPUs for a workload (its demand model)."""
    w = s.workloads[workloads[0]]
    m = s.models[w.model]
    decode = decode_model(m, s.cluster)
    bw = s.cluster.hbm_bytes_per_s * decode.eta * m.rollout_tp
    passes = sum(FLOPS_PER_TOKEN.values()) + (FLOPS_PER_TOKEN[Function.LOGPROBS] if w.reference_model else 0)
    train_s = passes * m.active_params * w.prompts_per_step * w.group_size * (
        w.prompt_tokens + _mean_length(w)) / (m.mfu * s.cluster.peak_flops * table.train_gpus)
    stale = mode == "plexrl"
    demand = RolloutDemand(
        num_samples=w.prompts_per_step * w.group_size, prompt_tokens=w.prompt_tokens,
        mean_tokens=_mean_length(w), tail_tokens=_tail_length(w),
        devices_per_instance=m.rollout_tp, t0_s=decode.t0_s,
        weight_read_s=decode.all_weight_bytes / bw if m.moe_saturation_batch > 1 else
        decode.dense_weight_bytes / bw,
        kv_read_s_per_token=decode.kv_bytes_per_token / bw, max_live_tokens=decode.max_live_tokens,
        rest_of_step_s=w.reward_s + m.weight_sync_s + (0.0 if stale else train_s + m.optimizer_step_s),
        shared_devices=table.train_gpus / len(workloads))
    choices = tuple(sorted({*table.plexrl_private_choices, table.plexrl_private_gpus}))
    instances = size_rollout_pool(demand, tuple(c // m.rollout_tp for c in choices))
    return instances * m.rollout_tp


def _mean_length(w) -> float:
    """Mean of the lognormal length, ignoring the cap (a planning estimate)."""
    return min(w.max_response_tokens, w.length_median * math.exp(w.length_sigma ** 2 / 2))


def _tail_length(w) -> float:
    """The longest response of a batch, roughly: the 1 - 1/n quantile, capped."""
    n = w.prompts_per_step * w.group_size
    z = math.sqrt(2 * math.log(max(n, 2)))
    return min(w.max_response_tokens, w.length_median * math.exp(w.length_sigma * z))
