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
from pathlib import Path

from plexrl.errors import ConfigError


def run_sim(args) -> int:
    from plexrl.sim.scenario import load_scenario
    scenario = load_scenario(args.scenario, tuple(args.overrides))
    seed = scenario.seed if args.seed is None else args.seed
    if seed < 0:
        raise ConfigError("seed must be 0 or more", field="--seed", value=seed, fix="pass --seed 0")
    out = _check_out(args.out)
    from plexrl.sim.preflight import preflight
    preflight(scenario)
    if args.sweep:
        from plexrl.sim.sweep import run_sweep
        report, results = run_sweep(scenario, seed), None
    else:
        from plexrl.sim.report import build_report
        report, results = build_report(scenario, seed)
    if args.format == "json":
        print(json.dumps(report, sort_keys=True))
    else:
        from plexrl.sim.report import render_table
        from plexrl.sim.sweep import render_sweep
        print(render_sweep(report) if args.sweep else render_table(report))
    if out is not None:
        from plexrl.sim.artifacts import write_artifacts
        for path in write_artifacts(out, report, results, scenario, seed):
            print(f"wrote {path}", file=sys.stderr)
    return 0


def _check_out(out: str | None) -> Path | None:
    if out is None:
        return None
    path = Path(out)
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise ConfigError(f"--out must be a writable directory, and {existing} is not one",
                          file=out, fix="name a new or existing directory you can write to")
    return path
