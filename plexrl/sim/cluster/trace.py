"""Trace jobs: the CSV a cluster-level replay reads, and the arithmetic of offered load.

Owns: ``TraceJob`` (a model, a GPU demand, an arrival time and a number of steps),
``read_csv`` (every row checked against the scenario; docs/trace-format.md lists the
columns), ``write_csv``, ``alone_step_s`` (each workload's step time run alone in
split-async at its fixed sizes, the unit that turns steps into isolated GPU-seconds),
``offered_load`` (rho), ``at_load`` (the same jobs at another rho) and ``between``
(a slice of a trace). Must not know: how a trace is replayed or placed.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from plexrl.errors import ConfigError
from plexrl.sim.cluster.replay import StepRates
from plexrl.sim.scenario import Scenario

#: Columns of a trace CSV, in the order ``write_csv`` writes them.
COLUMNS = ("job", "model", "workload", "gpus", "arrival_s", "num_steps", "priority")
#: Columns a file may leave out, with the value a missing one takes.
OPTIONAL = {"priority": 0}


@dataclass(frozen=True)
class TraceJob:
    """One job of a trace. ``model`` and ``workload`` are scenario keys ([models.*],
    [workloads.*]); ``gpus`` is the isolated demand (split-async rollout + training pools);
    ``arrival_s`` counts from the start of the trace; ``priority`` goes to JobSpec.priority."""

    job: str
    model: str
    workload: str
    gpus: int
    arrival_s: float
    num_steps: int
    priority: int = 0


def isolated_gpus(s: Scenario, model: str) -> int:
    """GPUs a job of ``model`` holds when run isolated: split-async rollout + training pool."""
    table = s.sizes[model]
    return table.split_rollout_gpus + table.train_gpus


# -- CSV -----------------------------------------------------------------------------------------
def read_csv(path: str | Path, scenario: Scenario) -> tuple[TraceJob, ...]:
    """The jobs of a trace CSV, sorted by (arrival_s, job); ConfigError names row and column.

    Rows are numbered as lines of the file: the header is row 1, the first job row 2.
    """
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read the trace: {e}", file=name,
                          fix="give the path of a readable UTF-8 CSV file") from None
    rows = list(csv.reader(text.splitlines()))
    if not rows or not any(cell.strip() for cell in rows[0]):
        raise ConfigError("empty trace file", file=name, field="row 1",
                          fix=f"start with the header {','.join(COLUMNS)} (docs/trace-format.md)")
    header = _check_header(rows[0], name)
    jobs, seen = [], {}
    for number, row in enumerate(rows[1:], start=2):
        if not row or not any(cell.strip() for cell in row):
            continue  # blank lines (a trailing newline) carry no job
        job = _parse_row(row, header, number, name, scenario)
        if job.job in seen:
            raise ConfigError("duplicate job id", file=name, field=f"row {number} column job",
                              value=job.job, fix=f"rename it: row {seen[job.job]} has it already")
        seen[job.job] = number
        jobs.append(job)
    if not jobs:
        raise ConfigError("the trace has no jobs", file=name, field="row 2",
                          fix="add one row per job under the header")
    return tuple(sorted(jobs, key=lambda j: (j.arrival_s, j.job)))


def write_csv(path: str | Path, jobs: Iterable[TraceJob]) -> None:
    """Write ``jobs`` with every column, floats in their shortest exact form (reads back equal)."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(COLUMNS)
        for j in jobs:
            out.writerow([j.job, j.model, j.workload, j.gpus, repr(float(j.arrival_s)),
                          j.num_steps, j.priority])


def _check_header(cells: list[str], file: str) -> list[str]:
    header = [c.strip() for c in cells]
    for index, column in enumerate(header, start=1):
        if column not in COLUMNS:
            raise ConfigError("unknown column", file=file, field=f"row 1 column {index}",
                              value=column, fix=f"use only {', '.join(COLUMNS)}")
        if header.index(column) != index - 1:
            raise ConfigError("column given twice", file=file, field=f"row 1 column {index}",
                              value=column, fix="keep one of the two")
    for column in COLUMNS:
        if column not in header and column not in OPTIONAL:
            raise ConfigError("missing column", file=file, field=f"row 1 column {column}",
                              fix=f"add a {column} column (docs/trace-format.md)")
    return header


def _parse_row(row: list[str], header: list[str], number: int, file: str,
               s: Scenario) -> TraceJob:
    if len(row) != len(header):
        raise ConfigError(f"{len(row)} values for {len(header)} columns", file=file,
                          field=f"row {number}", value=",".join(row),
                          fix=f"give one value per column: {','.join(header)}")
    cells = dict(zip(header, (c.strip() for c in row)))
    where = lambda column: f"row {number} column {column}"  # noqa: E731
    if not cells["job"]:
        raise ConfigError("empty job id", file=file, field=where("job"), value="",
                          fix="give every job a unique id")
    workload, model = cells["workload"], cells["model"]
    if workload not in s.workloads:
        raise ConfigError("unknown workload", file=file, field=where("workload"), value=workload,
                          fix=f"use one of {', '.join(sorted(s.workloads))}")
    if model not in s.models:
        raise ConfigError("unknown model", file=file, field=where("model"), value=model,
                          fix=f"use one of {', '.join(sorted(s.models))}")
    if s.workloads[workload].model != model:
        runs = s.workloads[workload].model
        raise ConfigError(f"workload {workload} runs model {runs}", file=file,
                          field=where("model"), value=model,
                          fix=f"set model to {runs} or pick another workload")
    gpus = _number(cells["gpus"], int, where("gpus"), file)
    want = isolated_gpus(s, model)
    if gpus != want:
        raise ConfigError(f"a {model} job holds {want} GPUs isolated", file=file,
                          field=where("gpus"), value=gpus,
                          fix=f"set gpus to {want} (sizes.{model}.split_rollout_gpus + train_gpus)")
    num_steps = _number(cells["num_steps"], int, where("num_steps"), file)
    if num_steps < 1:
        raise ConfigError("a job runs at least one step", file=file, field=where("num_steps"),
                          value=num_steps, fix="set num_steps to 1 or more")
    priority = (_number(cells["priority"], int, where("priority"), file)
                if "priority" in cells else OPTIONAL["priority"])
    return TraceJob(cells["job"], model, workload, gpus,
                    _number(cells["arrival_s"], float, where("arrival_s"), file), num_steps,
                    priority)


def _number(text: str, kind: type, field: str, file: str) -> int | float:
    """A finite, non-negative int or float; ConfigError otherwise."""
    try:
        value = kind(text)
    except ValueError:
        raise ConfigError(f"not {'an integer' if kind is int else 'a number'}", file=file,
                          field=field, value=text,
                          fix="write a plain decimal number" + (" without a fraction"
                                                                if kind is int else "")) from None
    if not math.isfinite(value) or value < 0:
        raise ConfigError("must be finite and not negative", file=file, field=field,
                          value=text, fix="write a number of 0 or more")
    return value


# -- load ----------------------------------------------------------------------------------------
def alone_step_s(s: Scenario) -> dict[str, float]:
    """Each workload's mean step time (s) run alone in split-async at its fixed sizes."""
    rates = StepRates(s)
    return {name: rates.alone(name) for name in s.workloads}


def isolated_gpu_s(job: TraceJob, alone_step_s: Mapping[str, float]) -> float:
    """GPU-seconds the job holds run isolated: gpus x num_steps x its workload's step time."""
    return job.gpus * job.num_steps * alone_step_s[job.workload]


def offered_load(jobs: Iterable[TraceJob], alone_step_s: Mapping[str, float], total_gpus: int,
                 span_s: float) -> float:
    """rho = sum of isolated GPU-s of the jobs / (total_gpus x span_s)."""
    return sum(isolated_gpu_s(j, alone_step_s) for j in jobs) / (total_gpus * span_s)


def at_load(jobs: Iterable[TraceJob], rho_now: float, rho_target: float) -> tuple[TraceJob, ...]:
    """The same jobs with arrival times (and so the span) scaled by rho_now / rho_target.

    Each job keeps its model, GPUs and steps; only time between arrivals stretches or
    shrinks, so the arrival pattern keeps its shape and the span to use with the result is
    ``span_s * rho_now / rho_target``. A diurnal cycle is compressed with it.
    """
    if rho_now <= 0 or rho_target <= 0:
        raise ConfigError("offered loads must be positive", field="rho",
                          value=(rho_now, rho_target), fix="give rho values above 0")
    factor = rho_now / rho_target
    return tuple(replace(j, arrival_s=j.arrival_s * factor) for j in jobs)


def between(jobs: Iterable[TraceJob], start_s: float, end_s: float) -> tuple[TraceJob, ...]:
    """The jobs arriving in [start_s, end_s), their arrivals shifted so start_s becomes 0."""
    return tuple(replace(j, arrival_s=j.arrival_s - start_s) for j in jobs
                 if start_s <= j.arrival_s < end_s)
