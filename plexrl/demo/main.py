"""One ``plexrl demo`` invocation: check the record, run the jobs, print and write results.

Owns: the order of work (the record is checked before anything runs, so a mismatch costs
nothing), the closing report (per job: warm-up and final greedy accuracy, reward of the
first and last 20% of GRPO steps; against the isolated record: device-seconds per step,
utilisation, slowdowns, saving), and ``summary.json``. Must not know: argument parsing.

Figures. Steps = warm-up + GRPO steps of all jobs. Held seconds: shared, from the first
call's start to the last call's end of the run; isolated, the sum of each job's own span
(the group holds one job at a time). Device-seconds per step = 1 device x held / steps.
Utilisation = busy / held, busy = seconds the group ran calls (the controller's call log).
Slowdown of a job = its mean GRPO step wall time shared / isolated. Saving = 1 - shared
device-seconds / isolated device-seconds.
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


def command_of(quick: bool, out: Path) -> str:
    return f"plexrl demo{' --quick' if quick else ''} --out {out}"


def run_demo(*, quick: bool, out: Path, isolated: bool, record: bool, scale: float = 1.0,
             stream=sys.stdout) -> int:
    from plexrl.demo.artifacts import write_curves, write_timeline
    from plexrl.demo.runner import Progress, run_isolated, run_shared, start_runtime, usage
    from plexrl.errors import ConfigError
    if record and not isolated:
        raise ConfigError("--record writes the isolated baseline and needs --isolated",
                          field="--record", fix="pass --isolated --record")
    jobs = demo_jobs(quick, scale)
    this_stamp = rec.stamp(jobs)
    baseline = None if isolated else rec.load_record(out, this_stamp, command_of(quick, out))
    mode = "isolated" if isolated else "shared"
    print(f"plexrl demo ({'quick' if quick else 'full'}, {mode}): {len(jobs)} jobs on one worker "
          f"group of 1 emulated device; config {this_stamp['config_hash']}", file=stream)
    runtime = start_runtime()
    try:
        progress = Progress(stream)
        results = (run_isolated if isolated else run_shared)(runtime, jobs, progress)
        calls = runtime.inspect("calls")
    finally:
        runtime.close()
    used = usage(calls, jobs)
    if isolated:           # the group holds one job at a time: the sum of their spans
        used["held_s"] = sum(j["held_s"] for j in used["jobs"].values())
    out.mkdir(parents=True, exist_ok=True)
    body = {"mode": mode, "usage": used,
            "jobs": {n: {**asdict(r), "first20": r.fifths[0], "last20": r.fifths[1],
                         "mean_step_s": r.mean_step_s} for n, r in results.items()}}
    _print_learning(results, stream)
    written = [write_timeline(out / f"timeline-{mode}.json", calls)]
    if isolated and record:
        written.append(rec.write_record(out, this_stamp, body))
    if not isolated:
        comparison = _compare(body, baseline, stream, command_of(quick, out))
        body["comparison"] = comparison
        iso = {n: j["rewards"] for n, j in baseline["jobs"].items()} if baseline else None
        written.append(write_curves(out / "reward-curves.png",
                                    {n: r.rewards for n, r in results.items()}, iso))
        summary = out / "summary.json"
        summary.write_text(json.dumps({"stamp": this_stamp, **body}, indent=1, sort_keys=True))
        written.append(summary)
    for path in written:
        print(f"wrote {path}", file=stream)
    return 0


def _print_learning(results, stream) -> None:
    print(f"\n{'job':<10} {'warm-up':>7} {'acc after warm-up':>17} {'acc at end':>10} "
          f"{'reward first 20%':>16} {'last 20%':>8}  targets (+{TARGET_REWARD_GAIN} reward, "
          f"+{TARGET_ACC_GAIN} acc, warm-up acc <= {WARMUP_ACC_MAX})", file=stream)
    for name, r in results.items():
        first, last = r.fifths
        ok = (last - first >= TARGET_REWARD_GAIN, r.acc_after - r.acc_before >= TARGET_ACC_GAIN,
              r.acc_before <= WARMUP_ACC_MAX)
        marks = " ".join(("ok" if o else "MISS") for o in ok)
        print(f"{name:<10} {r.warmup_steps:>7} {r.acc_before:>17.3f} {r.acc_after:>10.3f} "
              f"{first:>16.3f} {last:>8.3f}  {marks}", file=stream)
    print(f"(greedy accuracy on {HELDOUT} held-out prompts)", file=stream)


def _compare(shared: dict, baseline: dict | None, stream, command: str) -> dict | None:
    use = shared["usage"]
    if baseline is None:
        print(f"\nno isolated record in this --out; make one with: {command} --isolated "
              f"--record", file=stream)
        print(f"shared: {use['held_s'] / use['steps']:.4f} device-s/step, utilisation "
              f"{use['busy_s'] / use['held_s']:.2f}", file=stream)
        return None
    base = baseline["usage"]
    rows = {"isolated": base, "shared": use}
    print(f"\n{'':<9} {'held s':>8} {'busy s':>8} {'device-s/step':>13} {'utilisation':>11}",
          file=stream)
    for name, u in rows.items():
        print(f"{name:<9} {u['held_s']:>8.1f} {u['busy_s']:>8.1f} "
              f"{u['held_s'] / u['steps']:>13.4f} {u['busy_s'] / u['held_s']:>11.2f}", file=stream)
    slowdowns = {n: j["mean_step_s"] / baseline["jobs"][n]["mean_step_s"]
                 for n, j in shared["jobs"].items()}
    saving = 1 - use["held_s"] / base["held_s"]
    print("slowdown (mean GRPO step, shared / isolated): "
          + ", ".join(f"{n} {s:.2f}x" for n, s in slowdowns.items()), file=stream)
    print(f"saving: {saving:.1%} fewer device-seconds than running the jobs one after another",
          file=stream)
    return {"slowdown": slowdowns, "saving_frac": saving,
            "device_s_per_step": {k: u["held_s"] / u["steps"] for k, u in rows.items()},
            "utilisation": {k: u["busy_s"] / u["held_s"] for k, u in rows.items()}}
