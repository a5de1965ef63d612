"""The controller's call log keeps its newest records, and readers that count what they have
read take every record once, also across a drop (plexrl/runtime/observe/call_log.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from plexrl.runtime.observe import measures
from plexrl.runtime.observe.call_log import CallLog, read_since


def record(i: int, job: str = "a") -> dict:
    return {"call": i, "job": job, "wg": "wg0", "queued_s": float(i), "start_s": i + 0.1,
            "end_s": i + 0.5, "function": "generate", "failed": False}


def test_the_log_keeps_at_most_its_limit_and_a_tenth_newest_last():
    log = CallLog(limit=100)
    for i in range(1_000):
        log.append(record(i))
    assert 100 <= len(log) <= 110
    assert [r["call"] for r in log] == list(range(1_000 - len(log), 1_000))
    assert log.dropped + len(log) == 1_000


@given(limit=st.integers(1, 30), batches=st.lists(st.integers(0, 40), max_size=20))
def test_a_reader_takes_every_kept_record_once_and_counts_every_record(limit, batches):
    log, seen, read, appended = CallLog(limit), 0, [], 0
    for size in batches:
        for _ in range(size):
            log.append(record(appended))
            appended += 1
        new, seen = read_since(log, seen)
        read += [r["call"] for r in new]
        assert seen == appended
    assert read == sorted(set(read))                      # none twice, in order
    if appended:
        assert read[-1] == appended - 1


def test_a_plain_list_reads_the_same():
    calls = [record(i) for i in range(5)]
    new, seen = read_since(calls, 3)
    assert [r["call"] for r in new] == [3, 4] and seen == 5


def test_the_tally_counts_each_call_once_across_drops():
    log, tally = CallLog(limit=4), measures.Tally()
    for i in range(20):
        log.append(record(i, job="a" if i % 2 else "b"))
        tally.update(log)
    assert tally.num_calls == 20
    assert tally.jobs["a"].num_calls == 10 and tally.jobs["b"].num_calls == 10
