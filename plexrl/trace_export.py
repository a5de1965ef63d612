"""A Perfetto/Chrome trace of any window of a run, from the runtime's call log and transitions.

Owns: choosing the records of a window (and of one job), clipping them to it, and laying
them out on tracks: one per worker group (its calls and the idle gaps between them), one for
each worker group's transitions, and one per job (the waits and runs of its calls and the
transitions of its States). Spans that overlap on a track go to extra lanes ("NAME ·2"), so
every lane nests properly (Perfetto drops badly nested slices).

Input records are plain dicts as ``controller.inspect("calls")`` and
``inspect("transitions")`` return them: a call has job, function, step, seq, call, wg,
queued_s, start_s, end_s, duration_s, failed; a transition has job, wg, state, src, dst,
reason, num_bytes, end_s, seconds (it started ``seconds`` before ``end_s``). Times are seconds
on one clock (the runtime's monotonic clock); the trace shows them from ``origin_s``.

Must not know: Ray, the controller, or where the records came from (tests build them).
"""

from __future__ import annotations

from collections.abc import Iterable

from plexrl.timeline import Timeline

GROUPS, JOBS = "worker groups", "jobs"


def export_trace(calls: Iterable[dict], transitions: Iterable[dict], job: str | None = None,
                 since: float | None = None, until: float | None = None, *,
                 origin_s: float | None = None, max_events: int | None = None) -> Timeline:
    """The trace of the records that overlap [since, until] (either end open when None),
    of ``job`` only when given, clipped to the window. Zero of the trace: ``origin_s``, else
    ``since``, else the earliest record kept. Write it with ``.write(path)``."""
    window = Window(since, until)
    kept_calls = [c for c in calls if (job is None or c["job"] == job)
                  and window.overlaps(c["queued_s"], c["end_s"])]
    kept_moves = [t for t in transitions if (job is None or t["job"] == job)
                  and window.overlaps(_move_start(t), t["end_s"])]
    starts = [c["queued_s"] for c in kept_calls] + [_move_start(t) for t in kept_moves]
    origin = origin_s if origin_s is not None else since if since is not None else min(starts, default=0.0)
    lanes = Lanes()
    for c in sorted(kept_calls, key=lambda c: (c["start_s"], c["end_s"], c["call"])):
        _add_call(lanes, window, c)
    for wg in sorted({c["wg"] for c in kept_calls}):
        _add_idle(lanes, window, wg, [c for c in kept_calls if c["wg"] == wg])
    for t in sorted(kept_moves, key=lambda t: (_move_start(t), t["end_s"], t["wg"], t["state"])):
        _add_move(lanes, window, t)
    return lanes.timeline(origin, max_events)


class Window:
    """[since, until], either end open when None."""

    def __init__(self, since: float | None, until: float | None):
        self.lo = float("-inf") if since is None else since
        self.hi = float("inf") if until is None else until
        self.since, self.until = since, until

    def overlaps(self, start: float, end: float) -> bool:
        return end >= self.lo and start <= self.hi

    def clip(self, start: float, end: float) -> tuple[float, float] | None:
        start, end = max(start, self.lo), min(end, self.hi)
        return (start, end) if end >= start else None


class Lanes:
    """Spans gathered per track, then spread over lanes so none overlap on one lane."""

    def __init__(self):
        self.spans: dict[tuple[str, str], list[tuple]] = {}

    def add(self, group: str, track: str, name: str, start: float, end: float, args: dict,
            category: str) -> None:
        self.spans.setdefault((group, track), []).append((start, end, name, category, args))

    def timeline(self, origin: float, max_events: int | None) -> Timeline:
        out = Timeline(max_events=max_events)
        for group, track in sorted(self.spans, key=lambda k: (k[0] != GROUPS, k)):
            ends: list[float] = []   # end of the last span of each lane
            for start, end, name, category, args in sorted(self.spans[(group, track)],
                                                           key=lambda s: (s[0], s[1], s[2])):
                lane = next((i for i, e in enumerate(ends) if e <= start), len(ends))
                ends[lane:lane + 1] = [end]
                tid = out.track(track if lane == 0 else f"{track} ·{lane + 1}", group)
                out.span(tid, name, start - origin, end - start, args, category)
        return out


def _add_call(lanes: Lanes, window: Window, c: dict) -> None:
    args = {"job": c["job"], "function": c["function"], "step": c["step"], "seq": c["seq"],
            "call": int(c["call"]), "wg": c["wg"], "wait_s": round(c["start_s"] - c["queued_s"], 6),
            "run_s": round(c["end_s"] - c["start_s"], 6), "failed": bool(c.get("failed"))}
    name = f"{c['job']} {c['function']}"
    run = window.clip(c["start_s"], c["end_s"])
    if run is not None:
        lanes.add(GROUPS, c["wg"], name, *run, args, "call")
        lanes.add(JOBS, c["job"], c["function"], *run, args, "call")
    wait = window.clip(c["queued_s"], c["start_s"])
    if wait is not None and wait[1] > wait[0]:
        lanes.add(JOBS, c["job"], f"wait {c['function']}", *wait, args, "wait")


def _add_idle(lanes: Lanes, window: Window, wg: str, calls: list[dict]) -> None:
    """Idle gaps of a group: between its calls, and from the window's ends when they are set."""
    ordered = sorted(calls, key=lambda c: c["start_s"])
    cursor = window.since if window.since is not None else ordered[0]["start_s"]
    gaps = []
    for c in ordered:
        gaps.append((cursor, c["start_s"]))
        cursor = max(cursor, c["end_s"])
    if window.until is not None:
        gaps.append((cursor, window.until))
    for start, end in gaps:
        gap = window.clip(start, end) if end > start else None
        if gap is not None and gap[1] > gap[0]:
            lanes.add(GROUPS, wg, "idle", *gap, {"idle_s": round(gap[1] - gap[0], 6)}, "idle")


def _add_move(lanes: Lanes, window: Window, t: dict) -> None:
    span = window.clip(_move_start(t), t["end_s"])
    if span is None:
        return
    name = f"{t['state']} {t['src']}->{t['dst']}"
    args = {"job": t["job"], "wg": t["wg"], "state": t["state"], "src": t["src"], "dst": t["dst"],
            "reason": t.get("reason", ""), "num_bytes": int(t["num_bytes"])}
    lanes.add(GROUPS, f"{t['wg']} transitions", f"{t['job']} {name}", *span, args, "transition")
    lanes.add(JOBS, t["job"], name, *span, args, "transition")


def _move_start(t: dict) -> float:
    return t["end_s"] - t["seconds"]
