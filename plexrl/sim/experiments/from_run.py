"""A runtime run's logs as a scenario file: the measured calls, gaps and moves of its jobs.

Owns: reading a run's controller call log (job, function, step, seq, queued_s / start_s /
end_s, duration_s, and workspace_bytes where logged) and transition log (src, dst,
num_bytes, seconds), and writing a ``[measured]`` scenario (plexrl/sim/scenario.py
``MeasuredConfig``) that ``plexrl sim`` replays (plexrl/sim/experiments/measured.py). Per job, over
its timed steps (step >= ``warmup``): the calls of one step in order, each call's mean
seconds from dispatch to result (``duration_s``) and mean compute seconds on the service
(``compute_s``), the mean driver-side gap before each call (its queued time less the
previous call's end: reward and tool time, the driver's own work, the submit), and its
mean device reserve. Moves: achieved bytes/s per direction (bytes over copy seconds); the
copier's other work per move (median of end_s - start_s less the bytes at that rate, where
the log has start_s); and a round trip per move, taken as the median round trip of the
calls that carry no tensors (optim_step, sync_weights: dispatch to result less compute),
since the transition log times the service side only. Every value line says what it was measured from.
Must not know: the runtime (it reads plain dicts), how the scenario is simulated.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, replace

from plexrl.protocol import ModelSpec

ROUND_TRIP_FUNCTIONS = ("optim_step", "sync_weights")


@dataclass(frozen=True)
class RunInfo:
    """What the logs do not say: the run's group, its budget and the jobs' models."""

    run: str                                  #: what was measured, for the source comments
    models: dict[str, ModelSpec]              #: each job's policy model, by job name
    warmup: int                               #: steps before the timed ones
    timed_steps: int
    device_bytes: int
    num_devices: int = 1
    host_bytes: int = 4 << 30
    disk_bytes: int = 64 << 30
    nominal_bytes_per_s: float = 8e9
    queue_policy: str = "hrrs"
    prefetch: bool = True
    #: device reserve per job and function, where the call log has no workspace_bytes
    workspace_bytes: dict[str, dict[str, int]] | None = None
    rename: dict[str, str] | None = None      #: job name in the logs -> name in the scenario


@dataclass(frozen=True)
class JobShape:
    functions: tuple[str, ...]
    duration_s: tuple[float, ...]
    compute_s: tuple[float, ...]
    gap_s: tuple[float, ...]
    workspace_bytes: tuple[int, ...]
    steps: int                                #: timed steps it was measured over


def steps_of(calls: list[dict], job: str, first_step: int) -> dict[int, list[dict]]:
    """The job's calls that did not fail, by step, each step in its sequence order."""
    out: dict[int, list[dict]] = {}
    for call in calls:
        if call["job"] == job and not call.get("failed"):
            out.setdefault(call["step"], []).append(call)
    return {k: sorted(v, key=lambda c: c["seq"]) for k, v in sorted(out.items()) if k >= first_step}


def job_shape(calls: list[dict], job: str, warmup: int,
              workspace: dict[str, int] | None = None) -> JobShape:
    """Means over the timed steps of each call of a step; every step must make the same calls."""
    every = steps_of(calls, job, 0)
    timed = {k: v for k, v in every.items() if k >= warmup}
    if not timed:
        raise ValueError(f"job {job}: no calls at step {warmup} or later in the call log")
    shapes = {tuple(c["function"] for c in v) for v in timed.values()}
    if len(shapes) != 1:
        raise ValueError(f"job {job}: its steps make different calls: {sorted(shapes)}")
    functions = shapes.pop()
    steps = list(timed.values())

    def mean(values) -> float:
        return statistics.fmean(values)
    duration = tuple(mean(s[i]["end_s"] - s[i]["start_s"] for s in steps) for i in range(len(functions)))
    compute = tuple(mean(s[i]["duration_s"] for s in steps) for i in range(len(functions)))
    first = [every[k][0]["queued_s"] - every[k - 1][-1]["end_s"] for k in timed if k - 1 in every
             and (k - 1 >= warmup or len(timed) == 1)]
    gaps = [max(0.0, mean(first))] if first else [0.0]
    gaps += [max(0.0, mean(s[i]["queued_s"] - s[i - 1]["end_s"] for s in steps))
             for i in range(1, len(functions))]
    reserve = []
    for i, function in enumerate(functions):
        logged = [s[i]["workspace_bytes"] for s in steps if "workspace_bytes" in s[i]]
        if logged:
            reserve.append(math.ceil(mean(logged)))
        elif workspace is not None and function in workspace:
            reserve.append(int(workspace[function]))
        else:
            raise ValueError(f"job {job}: the call log has no workspace_bytes for {function} "
                             "and none was given")
    return JobShape(functions, duration, compute, tuple(gaps), tuple(reserve), len(steps))


def bandwidth(transitions: list[dict], src: str, dst: str) -> float | None:
    """Achieved bytes/s of the moves src -> dst that copied bytes (None if there were none)."""
    moved = [t for t in transitions if t["src"] == src and t["dst"] == dst
             and t["num_bytes"] > 0 and t["seconds"] > 0]
    if not moved:
        return None
    return sum(t["num_bytes"] for t in moved) / sum(t["seconds"] for t in moved)


def move_service_s(transitions: list[dict], bytes_per_s: dict[tuple[str, str], float]) -> float | None:
    """Median seconds the group's copier spent on a move beyond its bytes at the achieved
    rate (allocating, publishing, logging), from moves logged with their start (None if none)."""
    extra = [t["end_s"] - t["start_s"] - t["num_bytes"] / bytes_per_s[(t["src"], t["dst"])]
             for t in transitions if "start_s" in t and (t["src"], t["dst"]) in bytes_per_s
             and t["num_bytes"] > 0]
    return max(0.0, statistics.median(extra)) if extra else None


def round_trip_s(calls: list[dict]) -> float:
    """Median dispatch-to-result less compute of the calls that carry no tensors."""
    trips = [c["end_s"] - c["start_s"] - c["duration_s"] for c in calls
             if c["function"] in ROUND_TRIP_FUNCTIONS and not c.get("failed")]
    return max(0.0, statistics.median(trips)) if trips else 0.0


OVERRIDABLE = ("duration_s", "gap_s")


def export(calls: list[dict], transitions: list[dict], info: RunInfo,
           other: dict[str, JobShape] | None = None, fields: tuple[str, ...] = (),
           other_run: str = "") -> str:
    """The scenario file (TOML text) of the run's jobs ``info.models`` names. A diagnostic:
    take each job's ``fields`` (``duration_s`` (with compute_s), ``gap_s``) from the shapes
    ``other``, measured in ``other_run``, instead of from ``calls``."""
    rename = info.rename or {}
    shapes = {job: job_shape(calls, job, info.warmup, (info.workspace_bytes or {}).get(job))
              for job in info.models}
    if not set(fields) <= set(OVERRIDABLE):
        raise ValueError(f"only {OVERRIDABLE} can come from another run, not {fields}")
    for job, shape in (other or {}).items():
        if shape.functions != shapes[job].functions:
            raise ValueError(f"job {job}: the other run makes other calls: {shape.functions}")
        taken = {f: getattr(shape, f) for f in fields}
        if "duration_s" in fields:
            taken["compute_s"] = shape.compute_s
        shapes[job] = replace(shapes[job], **taken)
    src = f"measured from {info.run}"
    from_other = {f: f"measured from {other_run}" if other and f in fields else src
                  for f in OVERRIDABLE}
    onload = bandwidth(transitions, "host", "device")
    offload = bandwidth(transitions, "device", "host")
    bw_src = {"onload": f"{src}: host->device bytes / copy seconds",
              "offload": f"{src}: device->host bytes / copy seconds"}
    if onload is None and offload is None:
        onload = offload = info.nominal_bytes_per_s
        bw_src = {k: f"{src}: no moves copied bytes; the nominal rate" for k in bw_src}
    elif offload is None:
        offload, bw_src["offload"] = onload, f"{src}: no device->host moves; the onload rate"
    elif onload is None:
        onload, bw_src["onload"] = offload, f"{src}: no host->device moves; the offload rate"
    trip = round_trip_s([c for c in calls if c["job"] in info.models])
    service = move_service_s(transitions, {("host", "device"): onload, ("device", "host"): offload})
    service_src = (f"{src}: median service seconds of a move less its bytes / rate"
                   if service is not None else f"{src}: no move logged its start; 0")
    names = [rename.get(job, job) for job in info.models]
    out = [f"# Written by plexrl/sim/experiments/from_run.py: {src}. Replay: plexrl sim THIS_FILE",
           _line("name", "measured-run", "from_run.py: a measured run"),
           _line("description", f"replay of {info.run}", "from_run.py"),
           _line("num_steps", info.warmup + info.timed_steps, f"{src}: warm-up + timed steps"),
           _line("warmup_steps", info.warmup, f"{src}: warm-up steps, left out"),
           _line("queue_policy", info.queue_policy, f"{src}: the runtime's queue policy"),
           _line("prefetch", info.prefetch, f"{src}: the runtime's prefetch"),
           "", "[measured]",
           _line("run", info.run, "from_run.py"),
           _line("num_devices", info.num_devices, f"{src}: devices of the worker group"),
           _line("device_bytes", info.device_bytes, f"{src}: the device budget"),
           _line("host_bytes", info.host_bytes, f"{src}: host memory per node"),
           _line("disk_bytes", info.disk_bytes, f"{src}: disk per node"),
           _line("nominal_bytes_per_s", info.nominal_bytes_per_s, f"{src}: rate the core is told"),
           _line("onload_bytes_per_s", onload, bw_src["onload"]),
           _line("offload_bytes_per_s", offload, bw_src["offload"]),
           _line("move_latency_s", trip, f"{src}: median round trip of optim_step/sync_weights calls"),
           _line("move_service_s", service or 0.0, service_src),
           _line("serial_moves", True, "plexrl/runtime/workers/actor.py: one copy thread per group"),
           _line("backfill", False, "the runtime's core runs without backfill"),
           _line("barrier", True, "bench/multiplexing.py: shared jobs meet after the warm-up")]
    for job, name in zip(info.models, names):
        shape = shapes[job]
        at = f"{src}: job {job}, mean of {shape.steps} timed steps"
        held_at = f"{from_other['duration_s']}: job {job}, mean of the timed steps"
        gap_at = f"{from_other['gap_s']}: job {job}, mean of the timed steps"
        out += ["", f"[measured.jobs.{json.dumps(name)}]",
                _line("model", name, f"the job's model, [models.{name}]"),
                _line("functions", list(shape.functions), f"{src}: job {job}'s calls of a step"),
                _line("duration_s", list(shape.duration_s), f"{held_at}: dispatch to result"),
                _line("compute_s", list(shape.compute_s), f"{held_at}: the service's compute"),
                _line("gap_s", list(shape.gap_s), f"{gap_at}: previous result to queued"),
                _line("workspace_bytes", list(shape.workspace_bytes), f"{at}: device reserve")]
    for job, name in zip(info.models, names):
        spec = info.models[job]
        at = f"{src}: job {job}'s model spec"
        out += ["", f"[models.{json.dumps(name)}]"]
        out += [_line(key, getattr(spec, key), at) for key in
                ("name", "total_params", "active_params", "num_layers", "kv_heads", "head_dim",
                 "dtype_bytes", "tp", "pp", "dp", "ep", "rollout_tp", "optimizer")]
        if spec.kv_cache_tokens is not None:
            out.append(_line("kv_cache_tokens", spec.kv_cache_tokens, f"{at}: KV reserved per call"))
    return "\n".join(out) + "\n"


def _line(key: str, value, source: str) -> str:
    return f"{key} = {_toml(value)}  # {source}"


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(round(value, 9) if abs(value) < 1e6 else value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    raise TypeError(f"no TOML form for {value!r}")
