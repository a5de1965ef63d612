"""Benchmark: the simulator's prediction against the runtime's measurement, same jobs.

Runs bench/multiplexing.py (3 GRPO-like jobs with driver-side waits, each alone and then
all together on one worker group of 1 emulated device), exports the *isolated* runs' call
and transition logs as a scenario (plexrl/sim/experiments/from_run.py: each job's step as its measured
call durations and gaps, the group's budget and the jobs' State sizes as in the run,
measured move bandwidth and latency), runs ``plexrl sim`` on that file, and prints one JSON
object: measured and predicted device-seconds per training step (isolated, shared), the
saving, each job's step time alone and shared and its slowdown, and the relative error
(predicted - measured) / measured of each. Target: every |error| <= 20%.

Why the isolated runs: there each call's duration is the job's own and each gap is its
driver's own, so the shared run -- contention, queueing, job switches and their moves --
is left for the simulator to predict; a scenario exported from the shared run would carry
the contention in its durations and gaps and predict it twice. The isolated prediction is
then a replay check (the same calls, the same core) and the shared one the real test.

Diagnostics, to say which modelling assumption misses when a figure is off (none is part
of the prediction): the same scenario with each call's duration, then also each gap, taken
from the shared run (``diagnostics``; what is left is the model of queueing and job
switches); each job's busy seconds per step isolated, shared and (``--again STEPS``) in a
second isolated pass after the shared one (busy shared above both isolated passes: sharing
slowed the calls; the second pass as slow as the shared run: the machine did).

    PYTHONPATH=$PWD python bench/sim_vs_runtime.py --steps 40 --warmup 8 --again 20 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import multiplexing as mx

import plexrl
from plexrl.runtime.models import model_spec
from plexrl.runtime.transport import init_local
from plexrl.sim.experiments.from_run import RunInfo, export, job_shape, steps_of
from plexrl.sim.experiments.measured import predict
from plexrl.sim.scenario import load_scenario

TARGET_REL_ERROR = 0.20
#: diagnostic scenarios: the isolated export with these of each job taken from the shared run
DIAGNOSTICS = {"shared-durations": ("duration_s",), "shared-durations-gaps": ("duration_s", "gap_s")}


def export_isolated(logs: dict, plans, warmup: int, steps: int, run: str,
                    fields: tuple[str, ...] = ()) -> str:
    """The scenario of the isolated runs (job names as in the bench, no ``shared-``);
    ``fields`` (a diagnostic): each job's call durations and/or gaps from the shared run."""
    names = [p.name for p in plans]
    config = logs["config"]
    info = RunInfo(run=run, models={p.name: model_spec("policy", source=p.source) for p in plans},
                   warmup=warmup, timed_steps=steps, device_bytes=config.device_bytes,
                   num_devices=config.num_devices, host_bytes=config.host_bytes,
                   disk_bytes=config.disk_bytes, nominal_bytes_per_s=config.bytes_per_s,
                   queue_policy=config.queue_policy, prefetch=config.prefetch)
    calls = [c for c in logs["calls"] if c["job"] in names]
    transitions = [t for t in logs["transitions"] if t["job"] in names]
    if not fields:
        return export(calls, transitions, info)
    shared = {p.name: job_shape(logs["calls"], f"shared-{p.name}", warmup) for p in plans}
    return export(calls, transitions, info, shared, fields, "bench/multiplexing.py shared run")


def simulate(path: Path) -> dict:
    """``plexrl sim FILE --format json``, as a user runs it."""
    root = str(Path(plexrl.__file__).parents[1])     # this checkout's plexrl, not another
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (root, os.environ.get("PYTHONPATH"))))}
    out = subprocess.run([sys.executable, "-m", "plexrl.cli.main", "sim", str(path),
                          "--format", "json"], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout)


def rel(predicted: float, measured: float) -> float | None:
    """(predicted - measured) / measured; None where nothing was measured (no moves)."""
    return (predicted - measured) / measured if measured else None


def compare(measured: dict, predicted: dict) -> dict:
    """Each figure measured, predicted, and the relative error of the prediction."""
    def row(m: float, p: float) -> dict:
        return {"measured": m, "predicted": p, "rel_error": rel(p, m)}
    figures = {
        "isolated_device_s_per_step": row(measured["isolated"]["device_s_per_step"],
                                          predicted["isolated"]["device_s_per_step"]),
        "shared_device_s_per_step": row(measured["shared"]["device_s_per_step"],
                                        predicted["shared"]["device_s_per_step"]),
    }
    for name, job in measured["shared"]["jobs"].items():
        figures[f"slowdown_{name}"] = row(job["slowdown"], predicted["shared"]["jobs"][name]["slowdown"])
    detail = {"saving_frac": row(measured["device_s_saving_frac"], predicted["device_s_saving_frac"]),
              "shared_busy_s": row(measured["shared"]["busy_s"], predicted["shared"]["busy_s"]),
              "shared_moves": row(measured["shared"]["transitions"]["count"], predicted["shared"]["moves"])}
    for name, job in measured["isolated"]["jobs"].items():
        detail[f"alone_step_s_{name}"] = row(job["mean_step_s"],
                                             predicted["isolated"]["jobs"][name]["mean_step_s"])
        detail[f"shared_step_s_{name}"] = row(measured["shared"]["jobs"][name]["mean_step_s"],
                                              predicted["shared"]["jobs"][name]["mean_step_s"])
    worst = max(abs(f["rel_error"]) for f in figures.values())
    return {"figures": figures, "detail": detail, "max_abs_rel_error": worst,
            "target_rel_error": TARGET_REL_ERROR, "within_target": worst <= TARGET_REL_ERROR}


def busy_per_step(calls: list[dict], job: str, warmup: int) -> float:
    """Mean seconds a timed step of ``job`` held the group with its calls."""
    steps = steps_of(calls, job, warmup)
    return sum(c["end_s"] - c["start_s"] for v in steps.values() for c in v) / len(steps)


def isolated_again(plans, device_bytes: int, warmup: int, steps: int) -> list[dict]:
    """The isolated runs once more, after the shared one, on a fresh runtime: their call log.
    If calls run slower shared than in both isolated passes, sharing slowed them; if the
    second pass is as slow as the shared run, the machine did (other load)."""
    runtime = mx.one_group(device_bytes)
    try:
        for plan in plans:
            mx.run_isolated(runtime, plan, warmup, steps)
        return runtime.inspect("calls")
    finally:
        runtime.close()


def check(plans=mx.JOBS, *, warmup: int, steps: int, out: Path, again_steps: int = 0,
          swap: bool = True) -> dict:
    """Measure on the runtime, export the isolated runs, simulate, compare. Diagnostics: the
    same scenario with each call's duration as measured shared (what is left is the model
    of queueing and switching), and, with ``again_steps``, the isolated runs repeated."""
    logs: dict = {}
    measured = mx.measure(plans, warmup=warmup, steps=steps, swap=swap, logs=logs)
    names = [p.name for p in plans]
    again = isolated_again(plans, logs["config"].device_bytes, min(warmup, 4),
                           again_steps) if again_steps else []
    run = f"bench/multiplexing.py isolated runs, warmup {warmup}, steps {steps}"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "measured-multiplexing.toml"
    path.write_text(export_isolated(logs, plans, warmup, steps, run))
    (out / "calls.json").write_text(json.dumps(logs["calls"]))
    (out / "transitions.json").write_text(json.dumps(logs["transitions"]))
    predicted = simulate(path)
    diagnostics = {}
    for label, fields in DIAGNOSTICS.items():
        diag_path = out / f"measured-multiplexing-{label}.toml"
        diag_path.write_text(export_isolated(logs, plans, warmup, steps, run, fields))
        predicted_then = predict(load_scenario(str(diag_path)))    # as plexrl sim, in process
        diagnostics[label] = {"scenario": str(diag_path), **compare(measured, predicted_then)}
    busy = {n: {"isolated": busy_per_step(logs["calls"], n, warmup),
                "shared": busy_per_step(logs["calls"], f"shared-{n}", warmup)} for n in names}
    for n in names if again else ():
        busy[n]["isolated_again"] = busy_per_step(again, n, min(warmup, 4))
    return {"scenario": str(path), "exported": "isolated", **compare(measured, predicted),
            "busy_s_per_step": busy,
            "diagnostics": diagnostics,
            "measured": measured, "predicted": predicted}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="timed steps per job and mode")
    parser.add_argument("--warmup", type=int, default=8, help="untimed steps (calibration)")
    parser.add_argument("--out", default="sim-vs-runtime", help="directory for the scenario and logs")
    parser.add_argument("--again", type=int, default=0, metavar="STEPS",
                        help="repeat the isolated runs after the shared one (timed steps)")
    parser.add_argument("--no-swap", action="store_true",
                        help="the default 256 MiB device: all States fit, no switch moves")
    args = parser.parse_args()
    init_local(num_devices=1)
    result = check(warmup=args.warmup, steps=args.steps, out=Path(args.out), again_steps=args.again,
                   swap=not args.no_swap)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
