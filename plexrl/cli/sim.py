"""``plexrl sim``: run a scenario's experiments (or its sweep) and print or write the report.

Owns: the order of work for one invocation: load and validate everything first (a bad
input fails before anything is simulated or written), simulate, then print exactly one
JSON object (``--format json``) or a table, and write plots and a timeline into ``--out``.
Must not know: how the simulation works.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

from plexrl.errors import ConfigError


def run_sim(args) -> int:
    from plexrl.sim.scenario import load_scenario
    scenario = load_scenario(args.scenario, tuple(args.overrides))
    seed = scenario.seed if args.seed is None else args.seed
    if seed < 0:
        raise ConfigError("seed must be 0 or more", field="--seed", value=seed, fix="pass --seed 0")
    out = _check_out(args.out)
    if scenario.trace is not None:
        return _run_trace(args, replace(scenario, seed=seed), out)
    if scenario.measured is not None:
        return _run_measured(args, scenario, out)
    for flag, value in (("--sweep", "load" if args.sweep == "load" else None), ("--window", args.window)):
        if value is not None:
            raise ConfigError(f"{flag} {value} needs a trace scenario (one with a [trace] table)",
                              file=scenario.source, field=flag, value=value,
                              fix="run it on a trace scenario such as paper-trace")
    from plexrl.sim.experiments.preflight import preflight
    preflight(scenario)
    if args.sweep:
        from plexrl.sim.experiments.sweep import run_sweep
        report, results = run_sweep(scenario, seed), None
    else:
        from plexrl.sim.experiments.report import build_report
        report, results = build_report(scenario, seed)
    if args.format == "json":
        print(json.dumps(report, sort_keys=True))
    else:
        from plexrl.sim.experiments.report import render_table
        from plexrl.sim.experiments.sweep import render_sweep
        print(render_sweep(report) if args.sweep else render_table(report))
    if out is not None:
        from plexrl.sim.experiments.artifacts import write_artifacts
        for path in write_artifacts(out, report, results, scenario, seed):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def _run_trace(args, scenario, out: Path | None) -> int:
    from plexrl.sim.cluster import trace_report as tr
    if args.sweep == "axes":
        raise ConfigError("a trace scenario sweeps its load, not [sweep.axes]", file=scenario.source,
                          field="--sweep", fix="pass --sweep load")
    window = _window(args.window)
    if window is not None and out is None:
        raise ConfigError("--window writes timelines and needs --out", field="--window",
                          value=args.window, fix="add --out DIR")
    if args.sweep == "load":
        report, timelines = tr.build_load_sweep(scenario), {}
        text = tr.render_load_sweep(report)
    else:
        report, timelines = tr.build_trace_report(scenario, window)
        text = tr.render_trace(report)
    print(json.dumps(report, sort_keys=True) if args.format == "json" else text)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(report, sort_keys=True, indent=1))
        print(f"wrote {out / 'report.json'}", file=sys.stderr)
        for name, timeline in timelines.items():
            path = timeline.write(out / f"timeline-{name.replace('+', '-')}.json")
            print(f"wrote {path}", file=sys.stderr)
    return 0


def _run_measured(args, scenario, out: Path | None) -> int:
    """A measured run replayed (plexrl/sim/experiments/measured.py): its device-seconds per step, alone
    and shared, and each job's slowdown."""
    for flag, value in (("--sweep", args.sweep), ("--window", args.window)):
        if value:
            raise ConfigError(f"{flag} does not apply to a measured run", file=scenario.source,
                              field=flag, value=value, fix=f"drop {flag}")
    from plexrl.sim.experiments.measured import predict, render
    report = predict(scenario)
    print(json.dumps(report, sort_keys=True) if args.format == "json" else render(report))
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(report, sort_keys=True, indent=1))
        print(f"wrote {out / 'report.json'}", file=sys.stderr)
    return 0


def _window(text: str | None) -> tuple[float, float] | None:
    """``START:END`` in seconds from the first arrival."""
    if text is None:
        return None
    fix = "write START:END in seconds with START < END, e.g. --window 86400:172800"
    try:
        start, end = (float(part) for part in text.split(":"))
    except ValueError:
        raise ConfigError("not a window", field="--window", value=text, fix=fix) from None
    if not (0 <= start < end < float("inf")):
        raise ConfigError("not a window", field="--window", value=text, fix=fix)
    return start, end


def _check_out(out: str | None) -> Path | None:
    if out is None:
        return None
    path = Path(out)
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise ConfigError(f"--out must be a writable directory, and {existing} is not one",
                          file=out, fix="name a new or existing directory you can write to")
    return path
