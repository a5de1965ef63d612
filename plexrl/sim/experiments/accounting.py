"""Fair accounting of GPU-seconds: every allocated second of every pool is charged to a job.

Owns: the measurement window (after warm-up, while every job is running), the charge of
each worker group's allocated GPU-seconds to the jobs bound to it, split by the time each
held the group with its calls (idle, switching and syncing time included; an idle window
is split evenly), useful GPU-seconds (compute only), and steps per job within the window.
The sum of charges equals the sum of allocations, a test checks it in every mode.
Must not know: modes, the core, how calls were modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from plexrl.protocol import JobId, WorkerGroupId
from plexrl.sim.experiments.loop import Trace


@dataclass(frozen=True)
class Window:
    start_s: float
    end_s: float

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class Charges:
    """GPU-seconds within a window, per job, and allocated per worker group."""

    window: Window
    allocated: dict[WorkerGroupId, float]        #: devices x window, per group
    charged: dict[JobId, float]                  #: allocated GPU-s charged to each job
    useful: dict[JobId, float]                   #: compute GPU-s of each job's calls
    steps: dict[JobId, float]                    #: training steps completed, fractional


def measurement_window(step_ends: dict[JobId, list[float]], warmup_steps: int) -> Window:
    """From the last job's end of warm-up to the first job's last step."""
    start = max(ends[warmup_steps - 1] for ends in step_ends.values())
    end = min(ends[-1] for ends in step_ends.values())
    if end <= start:
        raise ValueError("jobs' measured steps do not overlap: simulate more steps")
    return Window(start, end)


def steps_in(ends: list[float], window: Window) -> float:
    """Steps completed inside the window, interpolating linearly between step ends."""
    index = np.arange(1, len(ends) + 1, dtype=float)
    times = np.asarray(ends, dtype=float)
    at = np.interp([window.start_s, window.end_s], times, index)
    return float(at[1] - at[0])


def _overlap(start: float, end: float, window: Window) -> float:
    return max(0.0, min(end, window.end_s) - max(start, window.start_s))


def charge(trace: Trace, devices: dict[WorkerGroupId, int], bound: dict[WorkerGroupId, list[JobId]],
           step_ends: dict[JobId, list[float]], window: Window) -> Charges:
    """Charge every group's allocated GPU-seconds in ``window`` to the jobs bound to it."""
    held = {wg: {job: 0.0 for job in jobs} for wg, jobs in bound.items()}
    useful = {job: 0.0 for job in step_ends}
    for rec in trace.calls:
        seconds = _overlap(rec.start_s, rec.end_s, window)
        held[rec.wg][rec.job] += seconds
        if rec.end_s > rec.start_s:
            useful[rec.job] += rec.useful_gpu_s * seconds / (rec.end_s - rec.start_s)
    allocated = {wg: devices[wg] * window.length_s for wg in bound}
    charged = {job: 0.0 for job in step_ends}
    for wg, jobs in bound.items():
        total = sum(held[wg].values())
        for job in jobs:
            share = held[wg][job] / total if total > 0 else 1 / len(jobs)
            charged[job] += allocated[wg] * share
    steps = {job: steps_in(ends, window) for job, ends in step_ends.items()}
    return Charges(window, allocated, charged, useful, steps)
