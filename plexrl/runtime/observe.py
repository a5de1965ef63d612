"""What an operator reads off a running controller: summaries of its call log and Snapshot.

Owns the definitions the metrics endpoint and the dashboard share (docs/design-obs.md):

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
from plexrl.protocol import Function, State, StateKey

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
    """Disjoint sorted intervals ``a`` less disjoint sorted intervals ``b``."""
    out = []
    for start, end in a:
        cursor = start
        for lo, hi in b:
            if hi <= cursor or lo >= end:
                continue
            if lo > cursor:
                out.append((cursor, lo))
            cursor = max(cursor, hi)
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
    later) it ran a call, the running one included."""
    since = max(now - window_s, started_s)
    span = now - since
    out = {}
    for wg in snap.group_order:
        running = snap.running.get(wg)
        mine = [c for c in calls if c["wg"] == wg and c["end_s"] > since]
        busy = busy_s(mine, since, now, running.started_at if running else None)
        out[wg] = busy / span if span > 0 else 0.0
    return out


def slowdowns(calls: list[dict], running: Iterable[CallView], queued: Iterable[CallView],
              now: float, live: set[str]) -> dict[str, dict]:
    """Per job: elapsed_s, blocked_s and slowdown = elapsed / (elapsed - blocked). A job
    still registered (``live``) runs until ``now``; others until their last call ended."""
    waits: dict[str, list[Interval]] = {}
    runs: dict[str, list[Interval]] = {}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for c in calls:
        job = c["job"]
        waits.setdefault(job, []).append((c["queued_s"], c["start_s"]))
        runs.setdefault(job, []).append((c["start_s"], c["end_s"]))
        first[job] = min(first.get(job, c["queued_s"]), c["queued_s"])
        last[job] = max(last.get(job, c["end_s"]), c["end_s"])
    for view in running:
        runs.setdefault(view.job, []).append((view.started_at, now))
        waits.setdefault(view.job, []).append((view.queued_at, view.started_at))
        first[view.job] = min(first.get(view.job, view.queued_at), view.queued_at)
    for view in queued:
        waits.setdefault(view.job, []).append((view.queued_at, now))
        first[view.job] = min(first.get(view.job, view.queued_at), view.queued_at)
    out = {}
    for job in sorted(first):
        end = now if job in live else last.get(job, now)
        blocked = length_s(minus(union_s(waits.get(job, [])), union_s(runs.get(job, []))))
        elapsed = max(0.0, end - first[job])
        alone = elapsed - blocked
        out[job] = {"elapsed_s": elapsed, "blocked_s": blocked,
                    "slowdown": elapsed / alone if alone > 0 else 1.0}
    return out


def saving(calls: list[dict], slow: dict[str, dict], devices: dict[str, int],
           now: float, busy_groups: Iterable[str] = ()) -> dict:
    """Shared against isolated device-seconds (see the module docstring). A group is held
    from its first call's queueing to its last call's end (``now`` while it is busy)."""
    held: dict[str, list[float]] = {}
    groups_of: dict[str, set[str]] = {}
    for c in calls:
        span = held.setdefault(c["wg"], [c["queued_s"], c["end_s"]])
        span[0], span[1] = min(span[0], c["queued_s"]), max(span[1], c["end_s"])
        groups_of.setdefault(c["job"], set()).add(c["wg"])
    for wg in busy_groups:
        if wg in held:
            held[wg][1] = now
    shared = sum(devices.get(wg, 1) * (end - start) for wg, (start, end) in held.items())
    isolated = sum(sum(devices.get(wg, 1) for wg in groups_of.get(job, ())) *
                   (s["elapsed_s"] - s["blocked_s"]) for job, s in slow.items())
    return {"shared_device_s": shared, "isolated_device_s": isolated,
            "saving_frac": 1 - shared / isolated if isolated > 0 else 0.0}


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
    next_seq = view.next_seq.get((call.role, call.copy))
    if call.seq != next_seq:
        return f"after its job's call #{next_seq} on {call.role}/{call.copy}"
    weights = snap.states.get(StateKey(call.job, call.role, call.copy, State.WEIGHTS))
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
