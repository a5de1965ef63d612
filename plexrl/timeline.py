"""A Chrome-trace / Perfetto JSON writer shared by the simulator, the runtime and ops tools.

Owns: the Trace Event Format (the JSON that chrome://tracing and ui.perfetto.dev open),
the mapping of tracks to Chrome "threads" grouped into "processes", conversion of
seconds to integer microseconds, an optional cap on stored events, and deterministic
output (the same calls give a byte-identical file).

Must not know: any clock (timestamps are arguments, virtual in the simulator, wall-clock
in the runtime), the scheduler's vocabulary (jobs, calls, worker groups are just names
and args here), or anything outside the standard library.

Layout: each ``group`` is a process (pid 1, 2, ... in creation order) and each track a
thread in it (tid 1, 2, ... in creation order, unique across groups). Metadata events
(names and sort indexes) are always kept and never count against ``max_events``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

_US_PER_S = 1e6


def _to_us(seconds: float) -> int:
    """Seconds to integer microseconds, the same way every time."""
    return round(seconds * _US_PER_S)


def _check_finite(what: str, **values: float) -> None:
    for key, value in values.items():
        if not math.isfinite(value):
            raise ValueError(f"{what}: {key} must be finite (got {value!r})")


class Timeline:
    """An in-memory trace; add tracks, spans, instants and counters, then ``write``."""

    def __init__(self, max_events: int | None = None):
        if max_events is not None and max_events < 0:
            raise ValueError(f"max_events must be >= 0 or None (got {max_events})")
        self.max_events = max_events
        self.dropped = 0
        self._metadata: list[dict] = []
        self._events: list[dict] = []
        self._pid_of_group: dict[str, int] = {}
        self._track_of_key: dict[tuple[str, str], int] = {}
        self._pid_of_track: dict[int, int] = {}

    def __len__(self) -> int:
        """Number of stored events, metadata excluded."""
        return len(self._events)

    def track(self, name: str, group: str = "") -> int:
        """The id of track ``name`` in ``group``, created (with its metadata) on first use."""
        key = (group, name)
        if key in self._track_of_key:
            return self._track_of_key[key]
        pid = self._group_pid(group)
        tid = len(self._track_of_key) + 1
        self._track_of_key[key] = tid
        self._pid_of_track[tid] = pid
        self._meta("thread_name", pid, tid, {"name": name})
        self._meta("thread_sort_index", pid, tid, {"sort_index": tid})
        return tid

    def span(self, track: int, name: str, start_s: float, dur_s: float,
             args: dict | None = None, category: str = "") -> None:
        """A complete event ("ph": "X") on ``track`` from ``start_s`` lasting ``dur_s``."""
        what = f"span {name!r} on track {track}"
        _check_finite(what, start_s=start_s, dur_s=dur_s)
        if dur_s < 0:
            raise ValueError(f"{what}: dur_s must be >= 0 (got {dur_s!r})")
        event = self._on_track(track, what, name, "X", start_s, args)
        event["dur"] = _to_us(dur_s)
        if category:
            event["cat"] = category
        self._add(event)

    def instant(self, track: int, name: str, at_s: float, args: dict | None = None) -> None:
        """A thread-scoped instant event ("ph": "i") on ``track`` at ``at_s``."""
        what = f"instant {name!r} on track {track}"
        _check_finite(what, at_s=at_s)
        event = self._on_track(track, what, name, "i", at_s, args)
        event["s"] = "t"
        self._add(event)

    def counter(self, name: str, at_s: float, values: dict[str, float], group: str = "") -> None:
        """A counter sample ("ph": "C"): one series per key of ``values``, shown in ``group``."""
        what = f"counter {name!r}"
        _check_finite(what, at_s=at_s, **{f"values[{k!r}]": v for k, v in values.items()})
        pid = self._group_pid(group)
        self._add({"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": _to_us(at_s),
                   "args": dict(values)})

    def to_dict(self) -> dict:
        """The trace as a JSON-ready dict: metadata events first, then events in call order."""
        return {
            "traceEvents": self._metadata + self._events,
            "displayTimeUnit": "ms",
            "otherData": {"num_events": len(self._events), "num_dropped": self.dropped,
                          "max_events": self.max_events},
        }

    def write(self, path: str | Path) -> Path:
        """Write the trace as compact, key-sorted JSON (parents created); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"),
                          allow_nan=False)
        path.write_text(text + "\n", encoding="utf-8")
        return path

    def _group_pid(self, group: str) -> int:
        if group not in self._pid_of_group:
            pid = len(self._pid_of_group) + 1
            self._pid_of_group[group] = pid
            self._meta("process_name", pid, 0, {"name": group or "plexrl"})
            self._meta("process_sort_index", pid, 0, {"sort_index": pid})
        return self._pid_of_group[group]

    def _meta(self, kind: str, pid: int, tid: int, args: dict) -> None:
        self._metadata.append({"ph": "M", "name": kind, "pid": pid, "tid": tid, "args": args})

    def _on_track(self, track: int, what: str, name: str, phase: str, at_s: float,
                  args: dict | None) -> dict:
        if track not in self._pid_of_track:
            raise ValueError(f"{what}: unknown track (create it with Timeline.track)")
        return {"ph": phase, "name": name, "pid": self._pid_of_track[track], "tid": track,
                "ts": _to_us(at_s), "args": dict(args or {})}

    def _add(self, event: dict) -> None:
        if self.max_events is not None and len(self._events) >= self.max_events:
            self.dropped += 1
            return
        self._events.append(event)
