"""The sensitivity sweep: how plexrl's savings move as one scenario setting moves (the
private-pool modes' and the rollout fleet's, ``shared_*``).

Owns: ``run_sweep`` (for each axis of ``[sweep.axes]``, each value, each of ``sweep.seeds``
seeds: the scenario with that value set, the savings of the first experiment of each model,
as ``report.py`` picks them; then mean and min over seeds, and the list of negative means),
expanding an axis target's ``*`` to every key of its table, and ``render_sweep``.
Must not know: the CLI, plots, how an experiment is simulated (``run_mode`` does that).

Departures from ``build_report``:

- sizes are searched once, at the base point (the scenario as given, the first seed), and
  held there for every variant (``search_sizes=false`` is set on the variants): a search per
  variant would multiply the axes x values x seeds runs by the size choices. With
  ``search_sizes = false`` in the scenario, CALIBRATION 6.4's fixed sizes are used;
- no alone runs (``with_alone=False``): slowdown is not reported here;
- a variant is the loaded scenario (command-line ``--set`` overrides included) with the
  axis override and ``search_sizes=false`` laid over it, then validated as a file would be.

The (axis, value, seed) runs are independent and go to a process pool; results are
assembled in (axis, value, seed) order, so the output does not depend on the workers.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from plexrl.config import apply_overrides, build
from plexrl.errors import ConfigError
from plexrl.sim.experiments.experiment import fixed_sizes, resolved_sizes, run_mode, search
from plexrl.sim.experiments.modes import Sizes
from plexrl.sim.experiments.pool import map_runs
from plexrl.sim.experiments.report import savings
from plexrl.sim.scenario import Scenario, validate

METRICS = ("vs_split_async", "vs_colocated", "shared_vs_split_async", "shared_vs_colocated")


def expand(s: Scenario, target: str, value: float) -> list[str]:
    """``target=value`` overrides, one per key of each table a ``*`` stands for."""
    data = dataclasses.asdict(s)
    paths = [[]]
    for part in target.split("."):
        if part != "*":
            paths = [p + [part] for p in paths]
            continue
        grown = []
        for p in paths:
            node = data
            for key in p:
                node = node.get(key) if isinstance(node, dict) else None
            if not isinstance(node, dict) or not node:
                raise ConfigError("'*' must stand for the keys of a non-empty table",
                                  file=s.source, field=target, value=".".join(p),
                                  fix="point the part before '*' at a table, e.g. workloads.*")
            grown += [p + [key] for key in node]
        paths = grown
    return [f"{'.'.join(p)}={_toml(value)}" for p in paths]


def _toml(value: float) -> str:
    """A TOML number an int field accepts when the value is whole (4096, not 4096.0)."""
    value = float(value)
    return str(int(value)) if value.is_integer() else repr(value)


def variant(s: Scenario, overrides: list[str]) -> Scenario:
    """``s`` with ``overrides`` and ``search_sizes=false`` laid over it, validated."""
    data = dataclasses.asdict(s)
    data.pop("source")
    data = apply_overrides(data, [*overrides, "search_sizes=false"], file=s.source)
    out = build(Scenario, data, file=s.source)
    validate(out, s.source)
    return dataclasses.replace(out, source=s.source)


def first_experiments(s: Scenario) -> dict[str, str]:
    """Model name -> the first experiment (file order) that uses it, as report.py picks."""
    out = {}
    for name, exp in s.experiments.items():
        out.setdefault(s.models[s.workloads[exp.workloads[0]].model].name, name)
    return out


def base_sizes(s: Scenario, seed: int) -> dict[str, dict[str, Sizes]]:
    """Experiment -> mode -> the sizes every variant runs at (searched at the base point)."""
    out = {}
    for name in first_experiments(s).values():
        workloads = s.experiments[name].workloads
        fixed = fixed_sizes(s.sizes[s.workloads[workloads[0]].model])
        out[name] = {mode: search(s, mode, workloads, seed, with_alone=False).chosen
                     if s.search_sizes else fixed for mode in s.modes}
    return out


def run_point(s: Scenario, seed: int, sizes: dict[str, dict[str, Sizes]] | None = None
              ) -> dict[str, dict[str, float | None]]:
    """The savings of one variant and seed: model -> metric -> saving (None: mode not run)."""
    out = {}
    for model, name in first_experiments(s).items():
        workloads = s.experiments[name].workloads
        fixed = fixed_sizes(s.sizes[s.workloads[workloads[0]].model])
        results = {mode: run_mode(s, mode, workloads, sizes[name][mode] if sizes else fixed,
                                  seed, with_alone=False)
                   for mode in s.modes}
        saved = savings(results, results)
        flat = {**saved, **{f"shared_{k}": v for k, v in saved["shared"].items()}}
        out[model] = {metric: flat[metric] for metric in METRICS}
    return out


def _summary(xs: list[float | None]) -> tuple[float | None, float | None]:
    if any(x is None for x in xs):
        return None, None
    return round(float(np.mean(xs)), 6), round(float(min(xs)), 6)


def run_sweep(s: Scenario, seed: int, max_workers: int | None = None) -> dict:
    """The sweep report (JSON-ready): per axis, per model and metric, mean and min over seeds."""
    if not s.sweep.axes:
        raise ConfigError("the scenario has no sweep axes", file=s.source, field="sweep.axes",
                          fix="add a [sweep.axes.NAME] table with target and values")
    seeds = list(range(seed, seed + s.sweep.seeds))
    points = [(axis, i, k) for axis, a in s.sweep.axes.items()
              for i in range(len(a.values)) for k in seeds]
    variants = {(axis, i): variant(s, expand(s, a.target, v))
                for axis, a in s.sweep.axes.items() for i, v in enumerate(a.values)}
    sizes = base_sizes(s, seed)
    jobs = [(variants[(axis, i)], k, sizes) for axis, i, k in points]
    saved = map_runs(run_point, jobs, max_workers)
    by_point = dict(zip(points, saved))
    models = list(first_experiments(s))
    sweep, negative = {}, []
    for axis, a in s.sweep.axes.items():
        table = {m: {metric: {"mean": [], "min": []} for metric in METRICS} for m in models}
        for i, value in enumerate(a.values):
            for m in models:
                for metric in METRICS:
                    mean, low = _summary([by_point[(axis, i, k)][m][metric] for k in seeds])
                    table[m][metric]["mean"].append(mean)
                    table[m][metric]["min"].append(low)
                    if mean is not None and mean < 0:
                        negative.append({"axis": axis, "value": value, "model": m,
                                         "metric": metric, "mean": mean})
        sweep[axis] = {"target": a.target, "values": list(a.values), "savings": table}
    chosen = {name: {mode: resolved_sizes(s, mode, s.experiments[name].workloads, sz)
                     for mode, sz in modes.items()}
              for name, modes in sizes.items()}
    return {"scenario": s.name, "seed": seed, "seeds": s.sweep.seeds, "sweep": sweep,
            "negative": negative, "sizes": chosen}


def _cell(mean: float | None, low: float | None) -> str:
    if mean is None:
        return "n/a"
    return f"{100 * mean:5.1f}% /{100 * low:5.1f}%"


def render_sweep(report: dict) -> str:
    """A plain-text table per axis: rows (model, metric), columns the values, mean / min."""
    lines = [f"scenario {report['scenario']}  seeds {report['seed']}.."
             f"{report['seed'] + report['seeds'] - 1}  (mean / min saving over seeds;"
             " sizes held at the base point)"]
    for axis, entry in report["sweep"].items():
        head = "".join(f"{_fmt(v):>19}" for v in entry["values"])
        lines += ["", f"{axis}  ({entry['target']})", f"  {'model':<22}{'metric':<16}{head}"]
        for model, metrics in entry["savings"].items():
            for metric, stats in metrics.items():
                cells = "".join(f"{_cell(m, lo):>19}" for m, lo in zip(stats["mean"], stats["min"]))
                lines.append(f"  {model:<22}{metric:<16}{cells}")
    lines.append("")
    if report["negative"]:
        lines.append("negative mean savings:")
        lines += [f"  {n['axis']}={_fmt(n['value'])}  {n['model']}  {n['metric']}  "
                  f"{100 * n['mean']:.1f}%" for n in report["negative"]]
    else:
        lines.append("no negative mean savings")
    return "\n".join(lines)


def _fmt(value: float) -> str:
    return f"{value:g}"
