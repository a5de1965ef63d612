"""Benchmark: wall time of the full ``paper-trace`` replay (every strategy, cold), and events/s.

Timed: what ``plexrl sim paper-trace`` does: read the trace (2,390 jobs, 2,048 GPUs, 90 days),
simulate every pool composition with the call-level simulator (2 worker processes), replay
all five strategies (2 worker processes). Target: under 60 s on this machine.
In-run baseline: the three-day tiny trace replayed with every call simulated (the yardstick
the memo is tested against) and memoised, one strategy each way: the memo's speed-up and
their makespan difference. Prints one JSON object.
"""

import json
import sys
import time
from pathlib import Path

from plexrl.sim.cluster import trace_report as tr
from plexrl.sim.cluster.replay import StepRates, replay, replay_calls
from plexrl.sim.scenario import load_scenario

TARGET_S = 60.0
TINY = str(Path(__file__).resolve().parent.parent / "tests" / "data" / "tiny-trace.toml")


def paper_trace() -> dict:
    start = time.perf_counter()
    s = load_scenario("paper-trace")
    jobs = tr.trace_jobs(s)
    rates = StepRates(s)
    rates.prefill(tr.compositions(s, jobs))
    composed = time.perf_counter()
    names = tr.strategy_names(s)
    results = tr.run_strategies(s, [(n, jobs) for n in names], rates)
    wall = time.perf_counter() - start
    events = sum(r.events for r in results)
    return {"wall_s": round(wall, 2), "target_s": TARGET_S, "meets_target": wall < TARGET_S,
            "compositions_s": round(composed - start, 2), "replays_s": round(wall - (composed - start), 2),
            "jobs": len(jobs), "compositions": len(rates.memo), "events": events,
            "plans": sum(r.plans for r in results), "events_per_s": round(events / wall, 1),
            "makespan_frac": tr.strategies_json(dict(zip(names, results)))}


def memo_against_calls(strategy: str = "spread+backfill") -> dict:
    s = load_scenario(TINY)
    jobs = tr.trace_jobs(s)
    rates = StepRates(s)
    rates.prefill(tr.compositions(s, jobs))
    t0 = time.perf_counter()
    memo = replay(s, jobs, strategy, rates).metrics()
    t1 = time.perf_counter()
    full = replay_calls(s, jobs, strategy, rates).metrics()
    t2 = time.perf_counter()
    return {"strategy": strategy, "jobs": len(jobs), "memo_wall_s": round(t1 - t0, 3),
            "call_level_wall_s": round(t2 - t1, 2), "speedup": round((t2 - t1) / (t1 - t0), 1),
            "makespan_rel_diff": round(memo["makespan_s"] / full["makespan_s"] - 1, 4),
            "mean_jct_rel_diff": round(memo["mean_jct_s"] / full["mean_jct_s"] - 1, 4)}


if __name__ == "__main__":
    out = {"paper_trace": paper_trace(), "baseline_tiny_trace": memo_against_calls()}
    for name, m in out["paper_trace"].pop("makespan_frac").items():
        out["paper_trace"].setdefault("makespan_frac", {})[name] = m["makespan_frac"]
    print(json.dumps(out, indent=1))
    sys.exit(0)
