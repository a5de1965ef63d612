"""One ``plexrl demo`` invocation: check the record, run the jobs, print and write results.

Owns: the order of work (the record is checked before anything runs, so a mismatch costs
nothing; with ``baseline="auto"`` and no record in ``--out``, the isolated baseline is
recorded first on the same runtime, then the shared run compares to it), the plan printed at
start (each job's task, model, sizes and remote-verifier latency), the closing report (per
job: warm-up and final greedy accuracy, reward of the first and last 20% of GRPO steps;
against the isolated record: device-seconds per step, utilisation, idle shares, slowdowns,
saving), and ``summary.json``. Must not know: argument parsing.

Figures. Steps = warm-up + GRPO steps of all jobs. Held seconds: shared, from the first
call's start to the last call's end of the run; isolated, the sum of each job's own span
(the group holds one job at a time). Device-seconds per step = the group's devices x held /
steps (``--devices``: one group of n devices, each job's model sharded over them).
Utilisation = busy / held, busy = seconds the group ran calls (the controller's call log).
Idle share of an isolated job = 1 - its busy / its held seconds. Slowdown of a job = its
mean GRPO step wall time shared / isolated. Saving = 1 - shared device-seconds / isolated
device-seconds.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

from plexrl.demo import record as rec
from plexrl.demo.plan import HELDOUT, demo_jobs

WARMUP_ACC_MAX = 0.8
TARGET_REWARD_GAIN, TARGET_ACC_GAIN = 0.15, 0.10
BASELINES = ("auto", "refresh", "skip")
ISOLATED_PREFIX = "isolated-"     #: job names of a baseline recorded before the shared run


def command_of(quick: bool, out: Path, devices: int = 1) -> str:
    return (f"plexrl demo{' --quick' if quick else ''}"
            f"{f' --devices {devices}' if devices != 1 else ''} --out {out}")


def run_demo(*, quick: bool, out: Path, isolated: bool, record: bool, baseline: str = "auto",
             scale: float = 1.0, stream=sys.stdout, live: bool | None = None,
             devices: int = 1) -> int:
    """``isolated``: run the jobs one after another (``record``: write the baseline).
    Otherwise the shared run; ``baseline="auto"`` records the baseline first when ``out``
    has none, ``"refresh"`` records it first whatever ``out`` holds (``make demo``: the
    baseline always comes from this code on this machine now), ``"skip"`` runs shared only."""
    from plexrl.demo.runner import start_runtime
    from plexrl.errors import ConfigError
    if record and not isolated:
        raise ConfigError("--record writes the isolated baseline and needs --isolated",
                          field="--record", fix="pass --isolated --record")
    if baseline not in BASELINES:
        raise ConfigError("unknown baseline mode", field="--baseline", value=baseline,
                          fix=f"use one of {BASELINES}")
    jobs = demo_jobs(quick, scale)
    this_stamp = rec.stamp(jobs, devices=devices)
    fresh = isolated or baseline == "refresh"
    found = None if fresh else rec.load_record(out, this_stamp, command_of(quick, out, devices))
    record_first = not isolated and found is None and baseline in ("auto", "refresh")
    mode = "isolated" if isolated else "shared"
    _print_plan(jobs, quick, mode, this_stamp, stream)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    _prefetch_imports(jobs)
    runtime = start_runtime(devices=devices)
    try:
        if record_first:
            why = "--baseline refresh: " if baseline == "refresh" else \
                f"no isolated record in {out}: "
            print(f"\n{why}recording the isolated baseline first (the same jobs one "
                  f"after another, each alone on the group)", file=stream)
        if isolated or record_first:
            prefix = ISOLATED_PREFIX if record_first else ""
            body, calls = _run(runtime, jobs, "isolated", prefix, stream, live, devices)
            written.append(_timeline(out, "isolated", calls, jobs, prefix))
            if record or record_first:
                written.append(rec.write_record(out, this_stamp, body))
                found = rec.load_record(out, this_stamp, command_of(quick, out, devices))
        if not isolated:
            if record_first:
                print("\nshared run: all jobs at once on the one worker group", file=stream)
            body, calls = _run(runtime, jobs, "shared", "", stream, live, devices)
            written.append(_timeline(out, "shared", calls, jobs, ""))
    finally:
        runtime.close()
    if not isolated:
        from plexrl.demo.artifacts import write_curves
        body["comparison"] = _compare(body, found, stream, command_of(quick, out, devices))
        iso = {n: j["rewards"] for n, j in found["jobs"].items()} if found else None
        written.append(write_curves(out / "reward-curves.png",
                                    {n: j["rewards"] for n, j in body["jobs"].items()}, iso))
        summary = out / "summary.json"
        summary.write_text(json.dumps({"stamp": this_stamp, **body}, indent=1, sort_keys=True))
        written.append(summary)
    for path in written:
        print(f"wrote {path}", file=stream)
    return 0


def _prefetch_imports(jobs) -> None:
    """Import reasoning-gym (seconds on a loaded machine) in a daemon thread while the
    runtime starts, when a job needs it."""
    import importlib
    import threading
    from plexrl.demo.plan import GYM_TASKS
    if any(j.task in GYM_TASKS for j in jobs):
        threading.Thread(target=importlib.import_module, args=("reasoning_gym",),
                         name="prefetch-reasoning-gym", daemon=True).start()


def _print_plan(jobs, quick, mode, this_stamp, stream) -> None:
    print(f"plexrl demo ({'quick' if quick else 'full'}, {mode}): {len(jobs)} jobs on one worker "
          f"group of 1 emulated device; config {this_stamp['config_hash']}", file=stream)
    print(f"{'job':<15} {'task':<15} {'model':<11} {'seed':>4} {'warm-up':>7} {'GRPO':>5} "
          f"{'prompts x group':>15} {'verifier':>9}", file=stream)
    for j in jobs:
        print(f"{j.name:<15} {f'{j.task} {j.min_len}-{j.max_len}':<15} {j.source:<11} "
              f"{j.seed:>4} {j.warmup_steps:>7} {j.steps:>5} "
              f"{f'{j.prompts_per_step} x {j.group_size}':>15} "
              f"{j.verifier_s * 1000:>6.0f} ms", file=stream)
    print("verifier: each GRPO round's completions are scored by a remote verifier that "
          "answers after the stated latency, the same isolated and shared", file=stream)


def _run(runtime, jobs, mode: str, prefix: str, stream, live,
         devices: int = 1) -> tuple[dict, list[dict]]:
    """Run ``jobs`` (``mode`` isolated or shared, names prefixed), print what they learned;
    the run's body (usage, per-job results) and its calls."""
    from plexrl.demo.progress import Progress
    from plexrl.demo.runner import run_isolated, run_shared, usage
    progress = Progress(stream, [j.name for j in jobs], live=live)
    try:
        results = (run_isolated if mode == "isolated" else run_shared)(runtime, jobs, progress,
                                                                        prefix)
    finally:
        progress.close()
    names = {prefix + j.name for j in jobs}
    calls = [c for c in runtime.inspect("calls") if c["job"] in names]
    used = usage(calls, jobs, prefix)
    if mode == "isolated":      # the group holds one job at a time: the sum of their spans
        used["held_s"] = sum(j["held_s"] for j in used["jobs"].values())
    used["devices"] = devices
    _print_learning(results, stream)
    body = {"mode": mode, "usage": used,
            "jobs": {n: {**asdict(r), "first20": r.fifths[0], "last20": r.fifths[1],
                         "mean_step_s": r.mean_step_s} for n, r in results.items()}}
    return body, calls


def _timeline(out: Path, mode: str, calls, jobs, prefix: str) -> Path:
    from plexrl.demo.artifacts import write_timeline
    return write_timeline(out / f"timeline-{mode}.json", calls, prefix_strip=prefix)


def _print_learning(results, stream) -> None:
    print(f"\n{'job':<15} {'warm-up':>7} {'acc after warm-up':>17} {'acc at end':>10} "
          f"{'reward first 20%':>16} {'last 20%':>8}  targets (+{TARGET_REWARD_GAIN} reward, "
          f"+{TARGET_ACC_GAIN} acc, warm-up acc <= {WARMUP_ACC_MAX})", file=stream)
    for name, r in results.items():
        first, last = r.fifths
        ok = (last - first >= TARGET_REWARD_GAIN, r.acc_after - r.acc_before >= TARGET_ACC_GAIN,
              r.acc_before <= WARMUP_ACC_MAX)
        marks = " ".join(("ok" if o else "MISS") for o in ok)
        print(f"{name:<15} {r.warmup_steps:>7} {r.acc_before:>17.3f} {r.acc_after:>10.3f} "
              f"{first:>16.3f} {last:>8.3f}  {marks}", file=stream)
    print(f"(greedy accuracy: mean verifier score on {HELDOUT} held-out prompts)", file=stream)


def _compare(shared: dict, baseline: dict | None, stream, command: str) -> dict | None:
    use = shared["usage"]
    if baseline is None:
        print(f"\nno isolated record in this --out; make one with: {command} --isolated "
              f"--record", file=stream)
        print(f"shared: {_device_s(use) / use['steps']:.4f} device-s/step, utilisation "
              f"{use['busy_s'] / use['held_s']:.2f}", file=stream)
        return None
    base = baseline["usage"]
    rows = {"isolated": base, "shared": use}
    print(f"\n{'':<9} {'held s':>8} {'busy s':>8} {'device-s/step':>13} {'utilisation':>11}",
          file=stream)
    for name, u in rows.items():
        print(f"{name:<9} {u['held_s']:>8.1f} {u['busy_s']:>8.1f} "
              f"{_device_s(u) / u['steps']:>13.4f} {u['busy_s'] / u['held_s']:>11.2f}", file=stream)
    idle = {n: j["idle_share"] for n, j in base["jobs"].items()}
    print("idle share of each job alone (device waiting on its driver and verifier): "
          + ", ".join(f"{n} {s:.0%}" for n, s in idle.items()), file=stream)
    slowdowns = {n: j["mean_step_s"] / baseline["jobs"][n]["mean_step_s"]
                 for n, j in shared["jobs"].items()}
    saving = 1 - _device_s(use) / _device_s(base)
    print("slowdown (mean GRPO step, shared / isolated): "
          + ", ".join(f"{n} {s:.2f}x" for n, s in slowdowns.items()), file=stream)
    print(f"saving: {saving:.1%} fewer device-seconds than running the jobs one after another",
          file=stream)
    return {"slowdown": slowdowns, "saving_frac": saving, "idle_share_isolated": idle,
            "device_s_per_step": {k: _device_s(u) / u["steps"] for k, u in rows.items()},
            "utilisation": {k: u["busy_s"] / u["held_s"] for k, u in rows.items()}}


def _device_s(usage: dict) -> float:
    """Device-seconds a run held its group for: its devices x its held seconds."""
    return usage.get("devices", 1) * usage["held_s"]
