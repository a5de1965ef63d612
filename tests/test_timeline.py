"""Tests of plexrl.timeline: Chrome-trace fields, units, determinism, the cap, grouping."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import plexrl.timeline as timeline_module
from plexrl.timeline import Timeline


def _sample() -> Timeline:
    tl = Timeline()
    wg0 = tl.track("wg-0", group="worker groups")
    wg1 = tl.track("wg-1", group="worker groups")
    job = tl.track("job-a", group="jobs")
    tl.span(wg0, "generate", 0.5, 1.25, args={"job": "a", "call": 3}, category="call")
    tl.span(wg1, "forward_backward", 1.0, 0.000_000_4)
    tl.instant(job, "step", 2.0, args={"step": 1})
    tl.counter("device_bytes", 2.0, {"wg-0": 1e9, "wg-1": 2e9}, group="worker groups")
    return tl


def _non_meta(trace: dict) -> list[dict]:
    return [e for e in trace["traceEvents"] if e["ph"] != "M"]


def test_written_file_is_valid_chrome_trace(tmp_path: Path):
    path = _sample().write(tmp_path / "deep" / "dir" / "trace.json")
    trace = json.loads(path.read_text())
    assert set(trace) == {"traceEvents", "displayTimeUnit", "otherData"}
    assert trace["displayTimeUnit"] == "ms"
    for event in trace["traceEvents"]:
        assert {"ph", "name", "pid", "tid"} <= set(event), event
        assert event["ph"] in {"M", "X", "i", "C"}
        if event["ph"] != "M":
            assert isinstance(event["ts"], int)
    assert [e["ph"] for e in _non_meta(trace)] == ["X", "X", "i", "C"]
    assert trace["otherData"]["num_events"] == 4


def test_spans_are_integer_microseconds():
    span, tiny = _non_meta(_sample().to_dict())[:2]
    assert (span["ts"], span["dur"]) == (500_000, 1_250_000)
    assert span["cat"] == "call" and span["args"] == {"job": "a", "call": 3}
    assert (tiny["ts"], tiny["dur"]) == (1_000_000, 0)  # 0.4 us rounds to 0
    tl = Timeline()
    tl.span(tl.track("t"), "x", 0.1 + 0.2, 1e-6)  # 0.30000000000000004 s
    assert _non_meta(tl.to_dict())[0]["ts"] == 300_000


def test_same_calls_give_byte_identical_files(tmp_path: Path):
    first = _sample().write(tmp_path / "a.json").read_bytes()
    second = _sample().write(tmp_path / "b.json").read_bytes()
    assert first == second
    assert b" " not in first.replace(b"worker groups", b"")  # compact separators


def test_cap_counts_dropped_events_and_reports_them(tmp_path: Path):
    tl = Timeline(max_events=3)
    track = tl.track("t")
    for i in range(10):
        tl.span(track, f"s{i}", i, 0.5)
    tl.counter("c", 11.0, {"v": 1.0})
    assert len(tl) == 3 and tl.dropped == 8
    trace = json.loads(tl.write(tmp_path / "t.json").read_text())
    assert [e["name"] for e in _non_meta(trace)] == ["s0", "s1", "s2"]
    assert trace["otherData"] == {"num_events": 3, "num_dropped": 8, "max_events": 3}
    # metadata is kept even past the cap
    late = tl.track("late")
    assert any(e["ph"] == "M" and e["tid"] == late for e in tl.to_dict()["traceEvents"])


def test_tracks_are_grouped_per_process_in_creation_order():
    tl = Timeline()
    a0, b0, a1 = tl.track("a0", "A"), tl.track("b0", "B"), tl.track("a1", "A")
    assert tl.track("a0", "A") == a0  # stable id
    assert len({a0, b0, a1}) == 3
    meta = [e for e in tl.to_dict()["traceEvents"] if e["ph"] == "M"]
    processes = {e["args"]["name"]: e["pid"] for e in meta if e["name"] == "process_name"}
    assert processes == {"A": 1, "B": 2}
    pid_of = {e["args"]["name"]: e["pid"] for e in meta if e["name"] == "thread_name"}
    assert pid_of == {"a0": 1, "b0": 2, "a1": 1}
    order = {e["tid"]: e["args"]["sort_index"] for e in meta if e["name"] == "thread_sort_index"}
    assert order[a0] < order[b0] < order[a1]


def test_negative_duration_is_rejected_naming_the_span():
    tl = Timeline()
    track = tl.track("wg-0")
    with pytest.raises(ValueError, match="optim_step"):
        tl.span(track, "optim_step", 1.0, -0.5)
    assert len(tl) == 0


@pytest.mark.parametrize("call", [
    lambda tl, t: tl.span(t, "nan-start", float("nan"), 1.0),
    lambda tl, t: tl.instant(t, "inf-instant", float("inf")),
    lambda tl, t: tl.counter("nan-counter", 1.0, {"v": float("nan")}),
    lambda tl, t: tl.span(t + 99, "unknown-track", 0.0, 1.0),
])
def test_bad_values_raise_value_error(call):
    tl = Timeline()
    with pytest.raises(ValueError):
        call(tl, tl.track("t"))


def test_writer_imports_only_the_standard_library_and_no_clock():
    tree = ast.parse(Path(timeline_module.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"__future__", "json", "math", "pathlib"}
