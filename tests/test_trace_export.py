"""``export_trace``: windows, tracks and lanes of a trace built from hand-made records."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from plexrl.trace_export import export_trace


def call(job, function, wg, queued, start, end, n=[0]):
    n[0] += 1
    return {"call": n[0], "job": job, "function": function, "wg": wg, "step": 0, "seq": n[0],
            "queued_s": queued, "start_s": start, "end_s": end, "duration_s": end - start,
            "failed": False}


def move(job, wg, end, seconds, src="host", dst="device"):
    return {"job": job, "wg": wg, "state": "trainer/weights", "src": src, "dst": dst,
            "reason": "onload", "num_bytes": 1024, "end_s": end, "seconds": seconds}


CALLS = [call("a", "generate", "wg0", 10.0, 10.0, 11.0), call("b", "generate", "wg0", 10.2, 11.5, 12.0),
         call("a", "logprobs", "wg0", 11.1, 12.0, 12.5), call("c", "generate", "wg1", 10.0, 10.1, 13.0)]
MOVES = [move("b", "wg0", 11.5, 0.4)]


def tracks(trace: dict) -> dict[int, str]:
    """tid -> "process/track" name."""
    procs = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    return {e["tid"]: f"{procs[e['pid']]}/{e['args']['name']}" for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def spans(trace: dict, track: str) -> list[dict]:
    tid = {name: tid for tid, name in tracks(trace).items()}[track]
    return sorted((e for e in trace["traceEvents"] if e["ph"] == "X" and e["tid"] == tid),
                  key=lambda e: e["ts"])


def test_a_track_per_worker_group_and_per_job_with_calls_idle_gaps_and_transitions():
    trace = export_trace(CALLS, MOVES).to_dict()
    assert set(tracks(trace).values()) >= {"worker groups/wg0", "worker groups/wg1",
                                           "worker groups/wg0 transitions", "jobs/a", "jobs/b",
                                           "jobs/c"}
    wg0 = spans(trace, "worker groups/wg0")
    assert [(e["name"], e["ts"], e["dur"]) for e in wg0] == [
        ("a generate", 0, 1_000_000), ("idle", 1_000_000, 500_000),
        ("b generate", 1_500_000, 500_000), ("a logprobs", 2_000_000, 500_000)]
    assert [e["args"]["job"] for e in wg0 if e["cat"] == "call"] == ["a", "b", "a"]
    b = {e["cat"]: e for e in spans(trace, "jobs/b") + spans(trace, "jobs/b ·2")}
    assert b["wait"]["dur"] == 1_300_000 and b["transition"]["args"]["num_bytes"] == 1024


def test_a_window_clips_and_a_job_filters():
    trace = export_trace(CALLS, MOVES, job="a", since=10.5, until=12.2).to_dict()
    assert {n.split("/")[1] for n in tracks(trace).values()} == {"wg0", "a"}
    wg0 = spans(trace, "worker groups/wg0")
    assert [(e["name"], e["ts"], e["dur"]) for e in wg0] == [
        ("a generate", 0, 500_000), ("idle", 500_000, 1_000_000), ("a logprobs", 1_500_000, 200_000)]


def test_the_file_is_deterministic_json(tmp_path):
    one = export_trace(CALLS, MOVES).write(tmp_path / "one.json").read_text()
    two = export_trace(list(reversed(CALLS)), MOVES).write(tmp_path / "two.json").read_text()
    assert one == two and json.loads(one)["otherData"]["num_events"] > 0


@st.composite
def records(draw):
    out = []
    for _ in range(draw(st.integers(1, 12))):
        queued = draw(st.floats(0, 10))
        start = queued + draw(st.floats(0, 2))
        end = start + draw(st.floats(0, 2))
        out.append(call(draw(st.sampled_from("ab")), "generate", draw(st.sampled_from(["g0", "g1"])),
                        queued, start, end))
    return out


@given(records(), st.none() | st.floats(0, 8), st.none() | st.floats(4, 14))
def test_no_two_spans_overlap_on_one_lane(calls, since, until):
    trace = export_trace(calls, [], since=since, until=until).to_dict()
    by_tid: dict[int, list[dict]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            by_tid.setdefault(e["tid"], []).append(e)
    for events in by_tid.values():
        events.sort(key=lambda e: (e["ts"], e["dur"]))
        for a, b in zip(events, events[1:]):
            assert a["ts"] + a["dur"] <= b["ts"] + 1   # 1 us: rounding to microseconds
