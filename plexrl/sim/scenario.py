"""Scenario files: the schema of a simulated experiment and how to load one by name or path.

Owns: the frozen config classes of a scenario (cluster, models, workloads, sizes,
experiments, sweep), loading a shipped scenario (``plexrl/scenarios/NAME.toml``) or a file,
with ``section.field=value`` overrides, and cross-field validation (references between
sections, layouts that cannot work). Every default here is a cited figure of
../shared/CALIBRATION.md; shipped scenario files repeat each value with its source.
Must not know: how a scenario is simulated.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from plexrl.config import load, option
from plexrl.errors import ConfigError
from plexrl.protocol import ModelSpec

MODES = ("colocated", "split-async", "plexrl", "plexrl-on-policy", "plexrl-shared",
         "plexrl-shared-on-policy")
STRATEGIES = ("isolated", "isolated+backfill", "pack", "spread", "spread+backfill")
#: every strategy a scenario may name; fleet+backfill shares the rollout fleet too (D207)
STRATEGY_CHOICES = (*STRATEGIES, "fleet+backfill")


@dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    gpu_name: str = option("H800", doc="accelerator model")
    device_memory_bytes: float = option(80e9, unit="bytes", min=1)
    usable_frac: float = option(0.85, unit="frac", min=0.05, max=1.0, doc="HBM an engine may use")
    peak_flops: float = option(989e12, unit="FLOP/s", min=1, doc="dense bf16 per GPU")
    hbm_bytes_per_s: float = option(3.35e12, unit="bytes/s", min=1)
    devices_per_node: int = option(8, unit="count", min=1)
    host_bytes_per_node: float = option(2e12, unit="bytes", min=0)
    disk_bytes_per_node: float = option(30e12, unit="bytes", min=0)
    nominal_onload_bytes_per_s: float = option(35e9, unit="bytes/s", min=1, doc="per GPU, told to the core")
    nominal_offload_bytes_per_s: float = option(50e9, unit="bytes/s", min=1)
    onload_bytes_per_s: float = option(10e9, unit="bytes/s", min=1, doc="per GPU, achieved (the sim's truth)")
    offload_bytes_per_s: float = option(10e9, unit="bytes/s", min=1)
    spill_bytes_per_s: float = option(28e9, unit="bytes/s", min=1, doc="per node, NVMe write")
    restore_bytes_per_s: float = option(52e9, unit="bytes/s", min=1, doc="per node, NVMe read")
    move_latency_s: float = option(1.0, unit="s", min=0)


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    name: str = option(doc="human-readable model name")
    total_params: float = option(unit="count", min=1)
    active_params: float = option(unit="count", min=1)
    num_layers: int = option(unit="count", min=1)
    kv_heads: int = option(unit="count", min=1)
    head_dim: int = option(unit="count", min=1)
    dtype_bytes: int = option(2, unit="bytes", min=1)
    tp: int = option(1, unit="count", min=1)
    pp: int = option(1, unit="count", min=1)
    dp: int = option(1, unit="count", min=1)
    ep: int = option(1, unit="count", min=1)
    rollout_tp: int = option(1, unit="count", min=1)
    optimizer: str = option("adamw", choices=("adamw", "adamw-offload"))
    mfu: float = option(0.35, unit="frac", min=0.01, max=1.0, doc="training model-FLOPs utilisation")
    optimizer_step_s: float = option(0.5, unit="s", min=0)
    weight_sync_s: float = option(2.0, unit="s", min=0, doc="trainer -> rollout copy, separate pools")
    colocated_sync_s: float = option(1.0, unit="s", min=0, doc="reshard in place, colocated")
    decode_t0_s: float = option(0.003, unit="s", min=0)
    decode_eta: float = option(0.75, unit="frac", min=0.01, max=1.0)
    decode_mfu: float = option(0.5, unit="frac", min=0.01, max=1.0, doc="matmul efficiency in decode")
    moe_saturation_batch: int = option(1, unit="count", min=1)
    prefill_tokens_per_s: float = option(50000.0, unit="tokens/s", min=1, doc="per rollout instance")
    kv_cache_tokens: int | None = option(None, unit="tokens", min=0,
                                         doc="standing KV cache per rollout instance; unset: the "
                                             "group's free memory; 0: reserved per call (runtime)")
    lora_rank: int = option(0, unit="count", min=0,
                            doc="0: full-weight training; r: LoRA adapters of rank r on the "
                                "frozen model, its base held once per worker group (D215)")
    adapter_params: float = option(0.0, unit="count", min=0,
                                   doc="parameters of one job's adapters (LoRA only)")

    def spec(self, trainable: bool = True) -> ModelSpec:
        """The model as jobs declare it; a LoRA model's trained States are its adapters'
        and its weights a shared base (``ModelSpec.lora_rank``)."""
        lora = dict(total_params=self.adapter_params, lora_rank=self.lora_rank, base=self.name,
                    base_params=self.total_params) if self.lora_rank and trainable else \
            dict(total_params=self.total_params)
        return ModelSpec(name=self.name, active_params=self.active_params,
                         num_layers=self.num_layers, kv_heads=self.kv_heads,
                         head_dim=self.head_dim, dtype_bytes=self.dtype_bytes, tp=self.tp,
                         pp=self.pp, dp=self.dp, ep=self.ep, rollout_tp=self.rollout_tp,
                         optimizer=self.optimizer, trainable=trainable,
                         kv_cache_tokens=self.kv_cache_tokens, **lora)


@dataclass(frozen=True, kw_only=True)
class WorkloadConfig:
    model: str = option(doc="key of [models.*]")
    prompts_per_step: int = option(128, unit="count", min=1)
    group_size: int = option(8, unit="count", min=1)
    prompt_tokens: int = option(300, unit="tokens", min=1)
    max_response_tokens: int = option(8192, unit="tokens", min=1)
    length_median: float = option(700.0, unit="tokens", min=1)
    length_sigma: float = option(0.9, unit="count", min=0, doc="lognormal sigma")
    length_drift_per_step: float = option(0.005, unit="frac", min=-0.5, max=0.5)
    tool_calls_mean: float = option(0.0, unit="count", min=0)
    tool_latency_median_s: float = option(1.0, unit="s", min=0)
    tool_latency_sigma: float = option(1.0, unit="count", min=0)
    reward_s: float = option(2.0, unit="s", min=0, doc="verifier time after rollout, CPU")
    reference_model: bool = option(False, doc="add a KL reference LOGPROBS pass")


@dataclass(frozen=True, kw_only=True)
class SizesConfig:
    """GPUs per job in each mode: CALIBRATION 6.4's fixed size and the sizing search's choices."""

    colocated_gpus: int = option(unit="count", min=1)
    colocated_choices: tuple[int, ...] = option(default_factory=tuple, unit="count", min=1)
    split_rollout_gpus: int = option(unit="count", min=1)
    split_rollout_choices: tuple[int, ...] = option(default_factory=tuple, unit="count", min=1)
    train_gpus: int = option(unit="count", min=1, doc="training pool, split-async and plexrl")
    plexrl_private_gpus: int = option(unit="count", min=1)
    plexrl_private_choices: tuple[int, ...] = option(default_factory=tuple, unit="count", min=1)
    fleet_gpus: int = option(0, unit="count", min=0,
                             doc="plexrl-shared: each job's share of the rollout fleet (0: plexrl_private_gpus)")
    fleet_choices: tuple[int, ...] = option(default_factory=tuple, unit="count", min=1)
    fleet_group_gpus: int = option(0, unit="count", min=0,
                                   doc="devices of one fleet group (0: one rollout instance)")
    shared_train_choices: tuple[int, ...] = option(
        default_factory=tuple, unit="count", min=1,
        doc="plexrl-shared: sizes of the one training pool all jobs share (train_gpus x jobs is tried too)")


@dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
    workloads: tuple[str, ...] = option(doc="keys of [workloads.*]; plexrl shares one training pool")
    description: str = option("")


@dataclass(frozen=True, kw_only=True)
class SweepAxis:
    target: str = option(doc="override path; '*' stands for every table, e.g. workloads.*.length_sigma")
    values: tuple[float, ...] = option(default_factory=tuple)


@dataclass(frozen=True, kw_only=True)
class SweepConfig:
    seeds: int = option(5, unit="count", min=1)
    axes: dict[str, SweepAxis] = option(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class TraceConfig:
    """A cluster-level replay: a CSV of trace jobs on ``total_gpus`` GPUs, under strategies."""

    file: str = option(doc="CSV of trace jobs (docs/trace-format.md), relative to the scenario file")
    total_gpus: int = option(2048, unit="count", min=8, doc="a whole number of nodes")
    span_s: float = option(90 * 86400.0, unit="s", min=1, doc="the window the arrivals fall in")
    rho: float = option(unit="frac", min=0, max=100,
                        doc="offered load: isolated GPU-s of all jobs / (total_gpus x span)")
    strategies: tuple[str, ...] = option(STRATEGIES, choices=STRATEGY_CHOICES)
    max_tenants: int = option(3, unit="count", min=1, doc="jobs per shared training pool")
    load_sweep: tuple[float, ...] = option((0.25, 0.5, 1.0, 1.5, 2.0), unit="frac", min=0.01,
                                           max=100, doc="rho values of --sweep load")


FUNCTIONS = ("generate", "logprobs", "forward_backward", "optim_step", "sync_weights")


@dataclass(frozen=True, kw_only=True)
class MeasuredJobConfig:
    """One job of a measured run, as its calls and its driver's gaps: one step is the calls
    of ``functions`` in order, each issued ``gap_s`` after the previous call's result came
    back (the first: after the previous step's last call) and holding the group
    ``duration_s`` (dispatch to result). Lists are parallel, one entry per call of a step.
    Every call is of the job's policy model (one model per measured job, as the bench's)."""

    model: str = option(doc="key of [models.*]; the sizes of the job's States")
    functions: tuple[str, ...] = option(choices=FUNCTIONS, doc="the calls of one step, in order")
    duration_s: tuple[float, ...] = option(unit="s", min=0, doc="dispatch to result, per call")
    compute_s: tuple[float, ...] = option(default_factory=tuple, unit="s", min=0,
                                          doc="the service's compute (what the core learns); "
                                              "empty: duration_s")
    gap_s: tuple[float, ...] = option(unit="s", min=0,
                                      doc="driver-side wait before each call (reward, tools)")
    workspace_bytes: tuple[int, ...] = option(unit="bytes", min=0,
                                              doc="device bytes each call reserves while it runs")
    staleness: int = option(0, unit="count", min=0, max=1)


@dataclass(frozen=True, kw_only=True)
class MeasuredConfig:
    """A run of the runtime replayed: its one worker group, its jobs' calls, measured moves.

    ``plexrl sim`` on a scenario with this table predicts the run's device-seconds per
    training step, each job alone and all together, and each job's slowdown, over the steps
    after the scenario's ``warmup_steps`` up to ``num_steps`` (plexrl/sim/experiments/measured.py).
    Written by plexrl/sim/experiments/from_run.py from a run's logs."""

    run: str = option("", doc="what was measured (command, mode)")
    num_devices: int = option(1, unit="count", min=1, doc="devices of the one worker group")
    device_bytes: int = option(unit="bytes", min=1, doc="memory of one device, as the core sees it")
    host_bytes: int = option(4 << 30, unit="bytes", min=1)
    disk_bytes: int = option(64 << 30, unit="bytes", min=0)
    nominal_bytes_per_s: float = option(8e9, unit="bytes/s", min=1,
                                        doc="host<->device rate the core is told")
    onload_bytes_per_s: float = option(unit="bytes/s", min=1, doc="achieved, host -> device")
    offload_bytes_per_s: float = option(unit="bytes/s", min=1, doc="achieved, device -> host")
    move_latency_s: float = option(0.0, unit="s", min=0,
                                   doc="a move's round trip from the core's decision to its report")
    move_service_s: float = option(0.0, unit="s", min=0,
                                   doc="the group's copy work per move beside its bytes "
                                       "(allocate, publish)")
    serial_moves: bool = option(True, doc="the group copies one move at a time (one copy thread)")
    backfill: bool = option(False, doc="the core's backfill (the runtime runs without)")
    barrier: bool = option(True, doc="shared jobs start their timed steps together")
    jobs: dict[str, MeasuredJobConfig] = option(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str = option(doc="scenario name")
    description: str = option("")
    seed: int = option(0, unit="count", min=0)
    num_steps: int = option(10, unit="count", min=2, doc="training steps simulated per job")
    warmup_steps: int = option(2, unit="count", min=1, doc="steps left out of the measurement")
    modes: tuple[str, ...] = option(MODES, choices=MODES)
    queue_policy: str = option("hrrs", choices=("fcfs", "round-robin", "hrrs"))
    prefetch: bool = option(True)
    search_sizes: bool = option(True, doc="search each mode's sizes within the choices")
    max_slowdown: float = option(0.0, min=0,
                                 doc="a shared mode's search keeps every job's slowdown against "
                                     "itself alone at most this (0: no bound)")
    train_workspace_frac: float = option(0.5, unit="frac", min=0, max=0.95,
                                         doc="device memory a training call reserves")
    cluster: ClusterConfig = option(default_factory=ClusterConfig)
    models: dict[str, ModelConfig] = option(default_factory=dict)
    workloads: dict[str, WorkloadConfig] = option(default_factory=dict)
    sizes: dict[str, SizesConfig] = option(default_factory=dict)
    experiments: dict[str, ExperimentConfig] = option(default_factory=dict)
    sweep: SweepConfig = option(default_factory=SweepConfig)
    trace: TraceConfig | None = option(None, doc="set for a cluster-level trace replay")
    measured: MeasuredConfig | None = option(None, doc="set to replay a measured runtime run")
    source: str = field(default="", compare=False)


def shipped() -> list[str]:
    """Names of the scenarios shipped with PlexRL."""
    return sorted(p.name[:-5] for p in resources.files("plexrl.scenarios").iterdir()
                  if p.name.endswith(".toml"))


def resolve(name_or_path: str) -> Path:
    """A shipped scenario's file by name, or the path given."""
    if name_or_path in shipped():
        return Path(str(resources.files("plexrl.scenarios") / f"{name_or_path}.toml"))
    path = Path(name_or_path)
    if not path.exists():
        raise ConfigError("no such scenario or file", file=name_or_path,
                          fix=f"name a shipped scenario ({', '.join(shipped())}) or an existing file")
    return path


def load_scenario(name_or_path: str, overrides: tuple[str, ...] = ()) -> Scenario:
    """Load, override and validate a scenario; every problem is a ConfigError naming the field."""
    path = resolve(name_or_path)
    scenario = load(Scenario, path, list(overrides))
    validate(scenario, str(path))
    return replace(scenario, source=str(path))


def _one_of(names, table: str) -> str:
    """The fix for an unknown name: the names the scenario has, or how to add the first."""
    if names:
        return f"use one of {', '.join(sorted(names))}"
    return f"the scenario has no {table}: add a [{table}.NAME] table and name it here"


def validate(s: Scenario, file: str) -> None:
    """Cross-field checks the schema cannot express."""
    if not s.modes:
        raise ConfigError("no modes to simulate", file=file, field="modes", value=[],
                          fix=f"list one or more of {', '.join(MODES)}")
    if s.warmup_steps >= s.num_steps:
        raise ConfigError("warmup must leave steps to measure", file=file, field="warmup_steps",
                          value=s.warmup_steps, fix=f"set it below num_steps ({s.num_steps})")
    for name, m in s.models.items():
        if m.lora_rank and m.adapter_params <= 0:
            raise ConfigError("a LoRA model needs its adapters' size", file=file,
                              field=f"models.{name}.adapter_params", value=m.adapter_params,
                              fix="rank x the sum of (in + out) features of every adapted "
                                  "matrix, from the model's config")
    for name, w in s.workloads.items():
        if w.model not in s.models:
            raise ConfigError("unknown model", file=file, field=f"workloads.{name}.model",
                              value=w.model, fix=_one_of(s.models, "models"))
        if w.model not in s.sizes:
            raise ConfigError("model has no [sizes] table", file=file, field=f"sizes.{w.model}",
                              fix=f"add [sizes.{w.model}] with the GPUs per mode")
    for name, e in s.experiments.items():
        for w in e.workloads:
            if w not in s.workloads:
                raise ConfigError("unknown workload", file=file,
                                  field=f"experiments.{name}.workloads", value=w,
                                  fix=_one_of(s.workloads, "workloads"))
        models = {s.workloads[w].model for w in e.workloads}
        if len(models) != 1:
            raise ConfigError("jobs sharing a training pool must use one model", file=file,
                              field=f"experiments.{name}.workloads", value=list(e.workloads),
                              fix="pair workloads of the same model")
    if not s.experiments and s.trace is None and s.measured is None:
        raise ConfigError("no experiments", file=file, field="experiments",
                          fix="add at least one [experiments.NAME] table")
    if s.measured is not None:
        _check_measured(s, s.measured, file)
    for model, table in s.sizes.items():
        _check_rollout_sizes(s, model, table, file)
    for name, axis in s.sweep.axes.items():
        if not axis.values:
            raise ConfigError("a sweep axis needs values", file=file, field=f"sweep.axes.{name}.values",
                              value=[], fix="list one or more values")
        if axis.target.startswith("sizes."):
            raise ConfigError("a sweep holds sizes at the base point; it cannot sweep them",
                              file=file, field=f"sweep.axes.{name}.target", value=axis.target,
                              fix="sweep a workload, model or cluster field")


def _check_rollout_sizes(s: Scenario, model: str, table: SizesConfig, file: str) -> None:
    """Rollout pools hold whole instances of ``rollout_tp`` devices."""
    if model not in s.models:
        raise ConfigError("sizes for an unknown model", file=file, field=f"sizes.{model}",
                          fix=_one_of(s.models, "models"))
    tp = s.models[model].rollout_tp
    for name in ("split_rollout_gpus", "plexrl_private_gpus", "split_rollout_choices",
                 "plexrl_private_choices", "fleet_gpus", "fleet_choices", "fleet_group_gpus"):
        values = getattr(table, name)
        for value in values if isinstance(values, tuple) else (values,):
            if value % tp:
                raise ConfigError(f"not a whole number of rollout instances of {tp} devices",
                                  file=file, field=f"sizes.{model}.{name}", value=value,
                                  fix=f"use a multiple of models.{model}.rollout_tp ({tp})")


def _check_measured(s: Scenario, m: MeasuredConfig, file: str) -> None:
    """Every measured job names a model and has one entry per call in each list."""
    if not m.jobs:
        raise ConfigError("a measured run needs jobs", file=file, field="measured.jobs",
                          fix="add [measured.jobs.NAME] tables (plexrl/sim/experiments/from_run.py writes them)")
    for name, job in m.jobs.items():
        where = f"measured.jobs.{name}"
        if job.model not in s.models:
            raise ConfigError("unknown model", file=file, field=f"{where}.model", value=job.model,
                              fix=_one_of(s.models, "models"))
        calls = len(job.functions)
        if not calls:
            raise ConfigError("a step needs calls", file=file, field=f"{where}.functions", value=[],
                              fix=f"list the calls of one step, from {', '.join(FUNCTIONS)}")
        for list_name in ("duration_s", "compute_s", "gap_s", "workspace_bytes"):
            values = getattr(job, list_name)
            if len(values) != calls and not (list_name == "compute_s" and not values):
                raise ConfigError(f"one entry per call of a step ({calls})", file=file,
                                  field=f"{where}.{list_name}", value=list(values),
                                  fix=f"give {calls} values, one for each of functions")
        if "optim_step" not in job.functions:
            raise ConfigError("a training step ends with an optim_step", file=file,
                              field=f"{where}.functions", value=list(job.functions),
                              fix="include optim_step among the calls of a step")
