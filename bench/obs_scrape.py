"""Benchmark: the cost of a metrics scrape and of a dashboard poll against the call log's size.

Builds a synthetic call log of N calls (3 jobs taking turns on one worker group, each call
queued 2 ms before it starts and running 10 ms) and an empty-of-jobs Snapshot of one group,
then times a scrape (``observe.readings`` + ``RuntimeMetrics.update`` + ``render``) after N
new calls (the first), then after no new ones (the steady state), and a dashboard poll
(``readings`` + ``dashboard_state`` + ``render_page``). Prints one JSON object: milliseconds
per operation (median of ``--repeat``) for each N, and the ratio of each to the smallest N
(the steady state should not grow with N: D170 of docs/design.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from plexrl.core.snapshot import Snapshot
from plexrl.runtime.config import RuntimeConfig, cluster_spec
from plexrl.runtime.observe.dashboard import dashboard_state, render_page
from plexrl.runtime.observe.metrics import RuntimeMetrics
from plexrl.runtime.observe.measures import Tally, readings

FUNCTIONS = ("generate", "logprobs", "forward_backward", "optim_step", "sync_weights")


def call_log(n: int) -> list[dict]:
    out, t = [], 0.0
    for i in range(n):
        start = t + 0.002
        out.append({"call": i, "job": f"job-{i % 3}", "seq": i // 3, "step": i // 15,
                    "function": FUNCTIONS[(i // 3) % 5], "role": "policy", "wg": "wg0",
                    "queued_s": t, "start_s": start, "end_s": start + 0.01, "duration_s": 0.009,
                    "failed": False})
        t = start + 0.01
    return out


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def measure(n: int, repeat: int) -> dict:
    snap = Snapshot(cluster=cluster_spec(RuntimeConfig(), {"wg0": "node0"}))
    calls = call_log(n)
    now = calls[-1]["end_s"] + 1.0
    metrics, tally = RuntimeMetrics(), Tally()

    def scrape():
        metrics.update(calls, snap, {}, readings(tally, calls, snap, now, 0.0, 60.0))
        metrics.render()

    def poll():
        state = dashboard_state(calls, snap, now, 0.0, readings(tally, calls, snap, now, 0.0, 60.0))
        render_page(state)
    start = time.perf_counter()
    scrape()
    first_ms = (time.perf_counter() - start) * 1e3
    return {"num_calls": n, "first_scrape_ms": round(first_ms, 3),
            "scrape_ms": round(timed(scrape, repeat), 3), "poll_ms": round(timed(poll, repeat), 3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rows = [measure(int(n), args.repeat) for n in args.sizes.split(",")]
    base = rows[0]
    for row in rows:
        row["scrape_ratio"] = round(row["scrape_ms"] / base["scrape_ms"], 2)
        row["poll_ratio"] = round(row["poll_ms"] / base["poll_ms"], 2)
    print(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
