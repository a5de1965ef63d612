"""A deterministic generator of synthetic trace jobs (``python -m plexrl.sim.cluster.tracegen``).

Owns: ``TraceShape`` (the knobs: target rho, workload mix, durations, daily cycle),
``generate`` (scenario + shape + seed -> trace jobs), ``private_gpus_costs`` (the table
behind each model's ``plexrl_private_gpus`` in a trace scenario) and the command line.
Must not know: how a trace is replayed.

How it draws, in order, from one ``numpy.random.default_rng(seed)``:

1. up to ``max_jobs`` jobs, each a workload (by ``mix`` weight) and an isolated duration
   from a lognormal capped at ``cap_hours`` whose mu makes the capped mean ``mean_hours``;
   a duration becomes ``num_steps = round(duration / alone step time)`` (at least 1);
2. the job count: the prefix whose isolated GPU-seconds come closest to
   ``rho x total_gpus x span_s`` (so the count follows from the target, not the reverse);
3. arrivals: a Poisson process conditioned on that count, i.e. i.i.d. times on
   [0, span_s) with density proportional to ``1 + diurnal x cos(2 pi (t - 14 h) / 1 day)``
   (rejection sampling), rounded to 1 ms; job ids ``t0000``... in arrival order.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, replace

import numpy as np

from plexrl.errors import ConfigError, PlexError
from plexrl.sim.experiments.experiment import fixed_sizes, run_mode
from plexrl.sim.scenario import Scenario, load_scenario
from plexrl.sim.cluster.trace import TraceJob, alone_step_s, isolated_gpus, offered_load, write_csv

DAY_S = 86400.0
PEAK_S = 14 * 3600.0  #: the hour of the day arrivals peak at (an estimate)
#: Workload weights of paper-trace, by job count: the paper's three models carry most of the
#: GPU time; the 1.5B/3B/7B jobs are many small ones (CALIBRATION 1.2: production Qwen 3B-32B).
PAPER_MIX = (("math1_5b", 0.05), ("math3b", 0.10), ("math7b", 0.20), ("agent7b", 0.10),
             ("math30b", 0.30), ("math235b", 0.25))


@dataclass(frozen=True)
class TraceShape:
    """What a generated trace looks like; durations are isolated (each job run alone)."""

    rho: float = 2.0                 #: target offered load (PAPER.md: ~1.8x capacity)
    mix: tuple[tuple[str, float], ...] = PAPER_MIX  #: (workload, weight by job count)
    mean_hours: float = 28.0         #: CALIBRATION 1.2 [P] RollMux production mean 27.9 h
    cap_hours: float = 143.0         #: CALIBRATION 1.2 [P] Philly-based max 142.9 h
    sigma: float = 1.0               #: lognormal sigma of durations [E] (heavy tail)
    diurnal: float = 0.3             #: amplitude of the daily arrival cycle, 0 = flat [E]
    max_jobs: int = 10000            #: draws available to reach the target


def capped_lognormal_mu(mean: float, sigma: float, cap: float) -> float:
    """mu such that E[min(X, cap)] = mean for X ~ lognormal(mu, sigma) (bisection)."""
    if not 0 < mean < cap:
        raise ConfigError("the mean duration must lie between 0 and the cap", field="mean_hours",
                          value=mean, fix=f"give a mean below the cap ({cap})")

    def capped_mean(mu: float) -> float:
        phi = lambda z: 0.5 * (1 + math.erf(z / math.sqrt(2)))  # noqa: E731
        z = (math.log(cap) - mu) / sigma
        return math.exp(mu + sigma ** 2 / 2) * phi(z - sigma) + cap * (1 - phi(z))

    lo, hi = math.log(mean) - 10 * sigma - 10, math.log(cap) + 10
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if capped_mean(mid) < mean else (lo, mid)
    return (lo + hi) / 2


def generate(s: Scenario, shape: TraceShape, seed: int,
             alone: dict[str, float] | None = None) -> tuple[TraceJob, ...]:
    """A trace of ``s.trace.total_gpus`` GPUs and ``s.trace.span_s`` at about ``shape.rho``."""
    if s.trace is None:
        raise ConfigError("the scenario has no [trace] table", file=s.source, field="trace",
                          fix="add [trace] with total_gpus, span_s and rho")
    names, weights = _mix(s, shape)
    alone = alone if alone is not None else alone_step_s(s)
    rng = np.random.default_rng(seed)
    drawn = np.asarray(names)[rng.choice(len(names), size=shape.max_jobs, p=weights)]
    mu = capped_lognormal_mu(shape.mean_hours, shape.sigma, shape.cap_hours)
    hours = np.minimum(rng.lognormal(mu, shape.sigma, size=shape.max_jobs), shape.cap_hours)
    steps = [max(1, round(h * 3600 / alone[w])) for w, h in zip(drawn, hours)]
    gpus = [isolated_gpus(s, s.workloads[w].model) for w in drawn]
    count = _count(np.cumsum([g * n * alone[w] for g, n, w in zip(gpus, steps, drawn)]),
                   shape.rho * s.trace.total_gpus * s.trace.span_s, shape.max_jobs)
    arrivals = _arrivals(rng, count, s.trace.span_s, shape.diurnal)
    width = max(4, len(str(count - 1)))
    return tuple(TraceJob(f"t{i:0{width}d}", s.workloads[w].model, str(w), g, a, n)
                 for i, (w, g, n, a) in enumerate(zip(drawn, gpus, steps, arrivals)))


def _mix(s: Scenario, shape: TraceShape) -> tuple[list[str], np.ndarray]:
    for name, weight in shape.mix:
        if name not in s.workloads:
            raise ConfigError("unknown workload in the mix", file=s.source, field="mix",
                              value=name, fix="use workloads of the scenario: "
                              + ", ".join(sorted(s.workloads)))
        if not weight > 0:
            raise ConfigError("mix weights must be positive", field="mix", value=(name, weight),
                              fix="drop the workload or give it a weight above 0")
    weights = np.array([w for _, w in shape.mix], dtype=float)
    return [n for n, _ in shape.mix], weights / weights.sum()


def _count(cumulative: np.ndarray, budget: float, max_jobs: int) -> int:
    """The number of jobs whose total isolated GPU-s comes closest to ``budget``."""
    first = int(np.searchsorted(cumulative, budget))  # first index with cumulative >= budget
    if first >= max_jobs:
        raise ConfigError(f"{max_jobs} jobs do not reach the target load", field="max_jobs",
                          value=max_jobs, fix="raise max_jobs or lower rho")
    below = cumulative[first - 1] if first else 0.0
    return first if first and budget - below < cumulative[first] - budget else first + 1


def _arrivals(rng: np.random.Generator, count: int, span_s: float, diurnal: float) -> list[float]:
    """``count`` sorted arrival times of a (daily-cycle) Poisson process, rounded to 1 ms."""
    out: list[float] = []
    while len(out) < count:
        t = rng.uniform(0.0, span_s, size=2 * count)
        u = rng.uniform(0.0, 1.0, size=2 * count)
        keep = u * (1 + diurnal) < 1 + diurnal * np.cos(2 * np.pi * (t - PEAK_S) / DAY_S)
        out.extend(t[keep].tolist())
    return sorted(round(t, 3) for t in out[:count])


# -- sizes ---------------------------------------------------------------------------------------
def private_gpus_costs(s: Scenario, seed: int) -> dict[str, dict[int, float]]:
    """Per model, per private rollout size: mean GPU-hours per step in plexrl mode with two
    identical jobs sharing the training pool, averaged over the model's workloads."""
    out = {}
    for model, table in s.sizes.items():
        workloads = [name for name, w in s.workloads.items() if w.model == model]
        costs = {}
        for gpus in sorted({*table.plexrl_private_choices, table.plexrl_private_gpus}):
            sizes = replace(fixed_sizes(table), plexrl_private_gpus=gpus)
            runs = [run_mode(s, "plexrl", (w, w), sizes, seed, with_alone=False)
                    for w in workloads]
            costs[gpus] = float(np.mean([r.mean("gpu_hours_per_step") for r in runs]))
        out[model] = costs
    return out


# -- command line --------------------------------------------------------------------------------
def describe(jobs: tuple[TraceJob, ...], alone: dict[str, float], s: Scenario) -> str:
    """A summary of a trace: count, offered load, durations, mix."""
    hours = np.array([j.num_steps * alone[j.workload] / 3600 for j in jobs])
    rho = offered_load(jobs, alone, s.trace.total_gpus, s.trace.span_s)
    counts = {}
    for j in jobs:
        counts[j.workload] = counts.get(j.workload, 0) + 1
    return "\n".join([
        f"jobs {len(jobs)}, total steps {sum(j.num_steps for j in jobs)}, "
        f"mean GPUs {np.mean([j.gpus for j in jobs]):.1f}",
        f"isolated duration: mean {hours.mean():.1f} h, median {np.median(hours):.1f} h, "
        f"max {hours.max():.1f} h",
        "mix: " + ", ".join(f"{w} {n}" for w, n in sorted(counts.items())),
        f"rho = {rho:.4f}"])


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m plexrl.sim.cluster.tracegen",
                                description=__doc__.split("\n")[0])
    p.add_argument("scenario", help="a shipped scenario name or a TOML file with a [trace] table")
    p.add_argument("--out", help="the CSV to write (docs/trace-format.md)")
    p.add_argument("--seed", type=int, help="seed (default: the scenario's)")
    d = TraceShape()
    p.add_argument("--rho", type=float, default=d.rho, help="target offered load")
    p.add_argument("--mix", default=",".join(f"{w}={x:g}" for w, x in d.mix),
                   help="workload=weight,... by job count")
    p.add_argument("--mean-hours", type=float, default=d.mean_hours)
    p.add_argument("--cap-hours", type=float, default=d.cap_hours)
    p.add_argument("--sigma", type=float, default=d.sigma)
    p.add_argument("--diurnal", type=float, default=d.diurnal)
    p.add_argument("--private-sizes", action="store_true",
                   help="print each model's plexrl GPU-hours per step by private rollout size")
    return p


def shape_of(args: argparse.Namespace) -> TraceShape:
    try:
        pairs = (item.split("=") for item in args.mix.split(","))
        mix = tuple((w.strip(), float(x)) for w, x in pairs)
    except ValueError:
        raise ConfigError("cannot read the mix", field="--mix", value=args.mix,
                          fix="write workload=weight,workload=weight") from None
    return TraceShape(rho=args.rho, mix=mix, mean_hours=args.mean_hours, cap_hours=args.cap_hours,
                      sigma=args.sigma, diurnal=args.diurnal)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        s = load_scenario(args.scenario)
        seed = s.seed if args.seed is None else args.seed
        if args.private_sizes:
            for model, costs in private_gpus_costs(s, seed).items():
                best = min(costs, key=lambda g: (costs[g], g))
                print(f"{model}: " + ", ".join(f"{g} -> {c:.4f}" for g, c in costs.items())
                      + f"; cheapest {best}")
            return 0
        if not args.out:
            raise ConfigError("no output file", field="--out", fix="give --out FILE.csv")
        shape = shape_of(args)
        _mix(s, shape)  # refuse a bad mix before measuring step times
        alone = alone_step_s(s)
        jobs = generate(s, shape, seed, alone)
        write_csv(args.out, jobs)
        print(describe(jobs, alone, s))
    except PlexError as err:
        print(f"tracegen: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
