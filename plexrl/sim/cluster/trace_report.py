"""The report of a trace scenario: every strategy on the trace, the load sweep, a timeline window.

Owns: reading a trace scenario's jobs, refusing a trace that cannot run (before anything is
simulated), simulating every pool composition the replay can meet
(in worker processes, before the replays), the JSON report (``strategies[<name>]`` =
makespan_frac, mean_queue_delay_s, mean_jct_s, p95_slowdown, max_slowdown, each job's slowdown
against the job alone on dedicated pools), the load sweep (the same jobs at each rho of
``[trace] load_sweep``) and the text table. Must not know: the CLI.
"""

from __future__ import annotations

from itertools import combinations_with_replacement
from pathlib import Path

from plexrl.core.allocation import place_pooled
from plexrl.core.decisions import Reject
from plexrl.core.snapshot import CoreConfig, Snapshot
from plexrl.errors import ConfigError
from plexrl.sim.experiments.modes import node_cluster
from plexrl.sim.experiments.pool import map_runs
from plexrl.sim.cluster.replay import BASELINE, STRATEGIES, ReplayResult, StepRates, replay, trace_spec
from plexrl.sim.scenario import Scenario
from plexrl.sim.cluster.trace import TraceJob, at_load, read_csv
from plexrl.timeline import Timeline

FIGURES = ("makespan_frac", "mean_queue_delay_s", "mean_jct_s", "p95_slowdown", "max_slowdown")


def trace_jobs(s: Scenario) -> tuple[TraceJob, ...]:
    return read_csv(Path(s.source).parent / s.trace.file, s)


def preflight(s: Scenario, jobs: tuple[TraceJob, ...]) -> None:
    """Refuse, before anything is simulated, a trace whose jobs could never run on its cluster."""
    empty = Snapshot(cluster=node_cluster(s.cluster, s.trace.total_gpus), config=CoreConfig())
    seen = set()
    for job in jobs:
        for layout in dict.fromkeys(STRATEGIES[name].layout for name in strategy_names(s)):
            if (job.workload, layout) in seen:
                continue
            seen.add((job.workload, layout))
            found = place_pooled(empty, trace_spec(s, job, layout, 0.0))
            if isinstance(found, Reject):
                raise ConfigError(found.reason.replace("{job}", job.job).split(". Fix:")[0],
                                  file=s.source, field="trace.total_gpus", value=s.trace.total_gpus,
                                  fix=f"give the cluster more GPUs, or drop the {job.workload} jobs "
                                      f"({layout} layout) from {s.trace.file}")


def compositions(s: Scenario, jobs: tuple[TraceJob, ...]) -> list[tuple[str, tuple[str, ...]]]:
    """Every pool composition a replay of ``jobs`` can meet under the scenario's strategies."""
    layouts = {STRATEGIES[name].layout for name in s.trace.strategies} | {"split-async"}
    by_model: dict[str, set[str]] = {}
    for job in jobs:
        by_model.setdefault(job.model, set()).add(job.workload)
    keys = []
    for workloads in by_model.values():
        kinds = sorted(workloads)
        keys += [("split-async", (w,)) for w in kinds]
        for layout in sorted(layouts & {"plexrl", "plexrl-shared"}):
            for k in range(1, s.trace.max_tenants + 1):
                keys += [(layout, c) for c in combinations_with_replacement(kinds, k)]
    return keys


def run_strategies(s: Scenario, runs: list[tuple[str, tuple[TraceJob, ...]]], rates: StepRates,
                   window: tuple[float, float] | None = None, workers: int = 2) -> list[ReplayResult]:
    """Replay each (strategy, jobs) in worker processes; the replays are independent and exact."""
    return map_runs(replay, [(s, jobs, name, rates, window) for name, jobs in runs], workers)


def strategy_names(s: Scenario) -> list[str]:
    """The scenario's strategies, the isolated baseline first."""
    return [BASELINE] + [n for n in s.trace.strategies if n != BASELINE]


def strategies_json(results: dict[str, ReplayResult]) -> dict:
    base = results[BASELINE].metrics()["makespan_s"]
    return {name: {k: round(v, 6) if isinstance(v, float) else v
                   for k, v in r.metrics(base).items()} for name, r in results.items()}


def build_trace_report(s: Scenario, window: tuple[float, float] | None = None,
                       workers: int = 2) -> tuple[dict, dict[str, Timeline]]:
    """The report of a trace scenario and, with a window, each strategy's timeline of it."""
    jobs = trace_jobs(s)
    preflight(s, jobs)
    rates = StepRates(s)
    rates.prefill(compositions(s, jobs), workers)
    names = strategy_names(s)
    results = dict(zip(names, run_strategies(s, [(n, jobs) for n in names], rates, window, workers)))
    report = {
        "scenario": s.name, "kind": "trace", "jobs": len(jobs), "total_gpus": s.trace.total_gpus,
        "span_s": s.trace.span_s, "rho": s.trace.rho, "max_tenants": s.trace.max_tenants,
        "compositions": len(rates.memo),
        "events": {name: r.events for name, r in results.items()},
        "strategies": strategies_json(results),
        "reference": {"pack": 0.70, "spread": 0.65, "spread+backfill": 0.56},
    }
    timelines = {name: r.timeline for name, r in results.items() if r.timeline is not None}
    return report, timelines


def build_load_sweep(s: Scenario, workers: int = 2) -> dict:
    """Every strategy at each rho of ``[trace] load_sweep``: the same jobs, arrivals rescaled."""
    jobs = trace_jobs(s)
    preflight(s, jobs)
    rates = StepRates(s)
    rates.prefill(compositions(s, jobs), workers)
    names = strategy_names(s)
    runs = [(name, at_load(jobs, s.trace.rho, rho)) for rho in s.trace.load_sweep for name in names]
    results = run_strategies(s, runs, rates, workers=workers)
    points = {}
    for i, rho in enumerate(s.trace.load_sweep):
        points[f"{rho:g}"] = strategies_json(dict(zip(names, results[i * len(names):(i + 1) * len(names)])))
    return {"scenario": s.name, "kind": "trace-load-sweep", "jobs": len(jobs),
            "total_gpus": s.trace.total_gpus, "rho": s.trace.rho, "load_sweep": points}


def render_trace(report: dict) -> str:
    lines = [f"{report['scenario']}: {report['jobs']} jobs on {report['total_gpus']} GPUs, "
             f"offered load rho {report['rho']:.2f}, {report['compositions']} pool compositions simulated",
             f"{'strategy':<18}{'makespan/isolated':>18}{'queue delay h':>15}{'JCT h':>10}"
             f"{'p95 slowdown':>14}{'max slowdown':>14}"]
    for name, m in report["strategies"].items():
        ref = report["reference"].get(name)
        lines.append(f"{name:<18}{m['makespan_frac']:>18.3f}{m['mean_queue_delay_s'] / 3600:>15.1f}"
                     f"{m['mean_jct_s'] / 3600:>10.1f}{m['p95_slowdown']:>14.1f}{m['max_slowdown']:>14.1f}"
                     + (f"   (reference ~{ref:.2f})" if ref else ""))
    return "\n".join(lines)


def render_load_sweep(report: dict) -> str:
    names = list(next(iter(report["load_sweep"].values())))
    lines = [f"{report['scenario']}: makespan / isolated makespan at each offered load rho",
             f"{'rho':>6}" + "".join(f"{n:>19}" for n in names)]
    for rho, point in report["load_sweep"].items():
        lines.append(f"{rho:>6}" + "".join(f"{point[n]['makespan_frac']:>19.3f}" for n in names))
    return "\n".join(lines)
