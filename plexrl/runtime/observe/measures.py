"""What an operator reads off a running controller: summaries of its call log and Snapshot.

Owns the definitions the metrics endpoint and the dashboard share (docs/design.md):

- utilisation of a worker group over a window: the share of it the group ran a call;
- a job's slowdown against running alone: its elapsed time over that time less the time it
  was blocked (a call of it queued and none of it running): alone, on its own group with
  its States resident, a call waits only for its dispatch, so the blocked time is what
  sharing cost it (its calls are taken to run as fast as alone);
- the saving against isolated: 1 - device-seconds the shared groups were held / the
  device-seconds the same jobs would hold each alone on their own groups for their
  unblocked time;
- switches: a group's consecutive calls of different jobs;
- why a queued call waits (``wait_reason``), from the Snapshot the core planned on.

Call records are the controller's call log entries (job, function, wg, queued_s, start_s,
end_s, ...); all times are seconds on one monotonic clock. Pure: every "now" is an argument.
Must not know: Ray, HTTP, Prometheus, HTML.
"""

from __future__ import annotations

from collections.abc import Iterable

from plexrl.core.planner import runnable
from plexrl.core.snapshot import CallView, Snapshot
from plexrl.core.transitions import is_resident, needed_keys
from plexrl.protocol import Function, State, StateKey, copy_id, copy_label
from plexrl.runtime.observe.call_log import read_since

Interval = tuple[float, float]


def union_s(intervals: Iterable[Interval]) -> list[Interval]:
    """The union of intervals as sorted, disjoint intervals."""
    out: list[list[float]] = []
    for start, end in sorted(i for i in intervals if i[1] > i[0]):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def length_s(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in intervals)


def minus(a: list[Interval], b: list[Interval]) -> list[Interval]:
    """Disjoint sorted intervals ``a`` less disjoint sorted intervals ``b`` (one pass)."""
    out, j = [], 0
    for start, end in a:
        while j < len(b) and b[j][1] <= start:
            j += 1
        cursor, k = start, j
        while k < len(b) and b[k][0] < end:
            if b[k][0] > cursor:
                out.append((cursor, b[k][0]))
            cursor = max(cursor, b[k][1])
            k += 1
        if cursor < end:
            out.append((cursor, end))
    return out


def busy_s(calls: Iterable[dict], since: float, until: float,
           running_since: float | None = None) -> float:
    """Seconds of [since, until] a group ran these calls (and one running since then)."""
    runs = [(max(c["start_s"], since), min(c["end_s"], until)) for c in calls]
    if running_since is not None:
        runs.append((max(running_since, since), until))
    return length_s(union_s(runs))


def utilisation(calls: list[dict], snap: Snapshot, now: float, window_s: float,
                started_s: float) -> dict[str, float]:
    """Per worker group: the share of the last ``window_s`` (or since ``started_s``, if
    later) it ran a call, the running one included. ``calls`` in end order (the call log's):
    only its tail inside the window is read."""
    since = max(now - window_s, started_s)
    span = now - since
    recent: dict[str, list[dict]] = {}
    for c in reversed(calls):
        if c["end_s"] <= since:
            break
        recent.setdefault(c["wg"], []).append(c)
    out = {}
    for wg in snap.group_order:
        running = snap.running.get(wg)
        busy = busy_s(recent.get(wg, ()), since, now, running.started_at if running else None)
        out[wg] = busy / span if span > 0 else 0.0
    return out


class JobTally:
    """One job's calls so far: its first queueing, last end, calls, groups, and its blocked
    time, frozen up to a horizon before which no interval can change any more."""

    def __init__(self, first_s: float):
        self.first_s, self.last_end_s = first_s, first_s
        self.num_calls = 0
        self.groups: set[str] = set()
        self.frozen_s = float("-inf")     #: blocked time before this is in ``blocked_s``
        self.blocked_s = 0.0
        self.waits: list[Interval] = []   #: after ``frozen_s``
        self.runs: list[Interval] = []

    def add(self, c: dict) -> None:
        self.first_s = min(self.first_s, c["queued_s"])
        self.last_end_s = max(self.last_end_s, c["end_s"])
        self.num_calls += 1
        self.groups.add(c["wg"])
        self.waits.append((max(c["queued_s"], self.frozen_s), c["start_s"]))
        self.runs.append((max(c["start_s"], self.frozen_s), c["end_s"]))

    def freeze(self, horizon: float) -> None:
        """Count the blocked time before ``horizon`` once; keep only what lies after it."""
        if horizon <= self.frozen_s:
            return
        waits, runs = union_s(self.waits), union_s(self.runs)
        self.blocked_s += length_s(minus(_before(waits, horizon), _before(runs, horizon)))
        self.waits, self.runs = _after(waits, horizon), _after(runs, horizon)
        self.frozen_s = horizon

    def blocked_with(self, waits: list[Interval], runs: list[Interval]) -> float:
        """Blocked seconds, counting also the waits and runs of calls not logged yet."""
        clip = [(max(a, self.frozen_s), b) for a, b in waits]
        runs = [(max(a, self.frozen_s), b) for a, b in runs]
        return self.blocked_s + length_s(minus(union_s(self.waits + clip),
                                               union_s(self.runs + runs)))


def _before(intervals: list[Interval], t: float) -> list[Interval]:
    return [(a, min(b, t)) for a, b in intervals if a < t]


def _after(intervals: list[Interval], t: float) -> list[Interval]:
    return [(max(a, t), b) for a, b in intervals if b > t]


class Tally:
    """Running sums over the append-only call log: each record is read once (``update``);
    the readings then cost the jobs' recent calls, not the whole log."""

    def __init__(self):
        self.num_calls = 0
        self.jobs: dict[str, JobTally] = {}
        self.held: dict[str, list[float]] = {}   #: wg -> [first queued, last end]

    def update(self, call_log: list[dict]) -> None:
        new, self.num_calls = read_since(call_log, self.num_calls)
        for c in new:
            self.jobs.setdefault(c["job"], JobTally(c["queued_s"])).add(c)
            span = self.held.setdefault(c["wg"], [c["queued_s"], c["end_s"]])
            span[0], span[1] = min(span[0], c["queued_s"]), max(span[1], c["end_s"])

    def slowdowns(self, running: Iterable[CallView], queued: Iterable[CallView], now: float,
                  live: set[str]) -> dict[str, dict]:
        """Per job: elapsed_s, blocked_s, slowdown = elapsed / (elapsed - blocked), and
        num_calls (logged). A job
        still registered (``live``) runs until ``now``; others until their last call ended.
        Freezes each job's tally before its oldest call still queued or running."""
        waits: dict[str, list[Interval]] = {}
        runs: dict[str, list[Interval]] = {}
        horizon: dict[str, float] = {}
        for view in running:
            runs.setdefault(view.job, []).append((view.started_at, now))
            waits.setdefault(view.job, []).append((view.queued_at, view.started_at))
            horizon[view.job] = min(horizon.get(view.job, now), view.queued_at)
        for view in queued:
            waits.setdefault(view.job, []).append((view.queued_at, now))
            horizon[view.job] = min(horizon.get(view.job, now), view.queued_at)
        for job in horizon:
            if job not in self.jobs:
                self.jobs[job] = JobTally(horizon[job])
        out = {}
        for job in sorted(self.jobs):
            tally = self.jobs[job]
            tally.freeze(horizon.get(job, now))
            first = min([tally.first_s] + [a for a, _ in waits.get(job, [])])
            end = now if job in live else tally.last_end_s
            blocked = tally.blocked_with(waits.get(job, []), runs.get(job, []))
            elapsed = max(0.0, end - first)
            alone = elapsed - blocked
            out[job] = {"elapsed_s": elapsed, "blocked_s": blocked,
                        "slowdown": elapsed / alone if alone > 0 else 1.0,
                        "num_calls": tally.num_calls}
        return out

    def saving(self, slow: dict[str, dict], devices: dict[str, int], now: float,
               busy_groups: Iterable[str] = ()) -> dict:
        """Shared against isolated device-seconds (see the module docstring). A group is held
        from its first call's queueing to its last call's end (``now`` while it is busy)."""
        held = {wg: (a, now if wg in busy_groups else b) for wg, (a, b) in self.held.items()}
        shared = sum(devices.get(wg, 1) * (end - start) for wg, (start, end) in held.items())
        isolated = sum(sum(devices.get(wg, 1) for wg in self.jobs[job].groups) *
                       (s["elapsed_s"] - s["blocked_s"]) for job, s in slow.items()
                       if job in self.jobs)
        return {"shared_device_s": shared, "isolated_device_s": isolated,
                "saving_frac": 1 - shared / isolated if isolated > 0 else 0.0}


def readings(tally: Tally, call_log: list[dict], snap: Snapshot, now: float, started_s: float,
             window_s: float) -> dict:
    """What the metrics and the dashboard show at ``now``: utilisation per group, slowdown
    per job, the saving against isolated (``tally`` brought up to date first)."""
    tally.update(call_log)
    slow = tally.slowdowns(snap.running.values(), snap.queued, now, set(snap.jobs))
    devices = {wg: g.num_devices for wg, g in snap.cluster.worker_groups.items()}
    return {"utilisation": utilisation(call_log, snap, now, window_s, started_s),
            "slowdowns": slow, "saving": tally.saving(slow, devices, now, snap.running)}


def slowdowns(calls: list[dict], running: Iterable[CallView], queued: Iterable[CallView],
              now: float, live: set[str]) -> dict[str, dict]:
    """``Tally.slowdowns`` of these calls (tests, tools)."""
    tally = Tally()
    tally.update(calls)
    return tally.slowdowns(running, queued, now, live)


def saving(calls: list[dict], slow: dict[str, dict], devices: dict[str, int], now: float,
           busy_groups: Iterable[str] = ()) -> dict:
    """``Tally.saving`` of these calls (tests, tools)."""
    tally = Tally()
    tally.update(calls)
    return tally.saving(slow, devices, now, busy_groups)


def switches(calls: Iterable[dict]) -> dict[str, int]:
    """Per worker group: how often its next call was another job's (calls in end order,
    which is start order on a group: it runs one call at a time)."""
    last: dict[str, str] = {}
    out: dict[str, int] = {}
    for c in calls:
        wg = c["wg"]
        out.setdefault(wg, 0)
        if wg in last and last[wg] != c["job"]:
            out[wg] += 1
        last[wg] = c["job"]
    return out


def wait_reason(snap: Snapshot, call: CallView) -> str:
    """Why a queued call has not run, in the core's terms, on the Snapshot it planned on."""
    view = snap.jobs.get(call.job)
    if view is None:
        return "its job is ending"
    next_seq = view.next_seq.get(copy_id(call.role, call.copy, call.lane))
    if call.seq != next_seq:
        return (f"after its job's call #{next_seq} on "
                f"{call.role}/{copy_label(call.copy, call.lane)}")
    weights = snap.states.get(StateKey(call.job, call.role, call.copy, State.WEIGHTS, call.lane))
    if call.function == Function.GENERATE and weights and weights.version != call.version:
        return f"waits for weights v{call.version} (has v{weights.version})"
    if call not in runnable(snap, call.wg):
        return "waits for the trainer's weights to sync"
    running = snap.running.get(call.wg)
    if running is not None:
        return f"group busy: {running.job} {running.function}"
    moving = any(not is_resident(snap.states[k]) for k in needed_keys(snap, call))
    onloading = snap.onloading.get(call.wg)
    if onloading == call.call:
        return "its States are moving onto the device"
    if onloading is not None:
        return "the group is making room for another call"
    if moving:
        return "its States are not on the device"
    return f"picked by the {snap.config.queue_policy} queue policy next"
