"""Swapping does not leak: the service's resident memory is flat over 50 swap cycles."""

from __future__ import annotations

import grpo_like
from test_equivalence import BUDGET, SPEC


def test_resident_memory_after_50_swap_cycles_is_within_5_percent_of_cycle_5(connect):
    runtime = connect(device_bytes=BUDGET)     # one job's States fit, not both: every turn swaps
    jobs = [runtime.register_job(name, {"policy": SPEC}, seed=seed)
            for name, seed in (("a", 1), ("b", 2))]
    rss, moves = {}, {}
    for cycle in range(1, 51):
        for job in jobs:
            grpo_like.step(job, cycle - 1)
        if cycle in (5, 50):
            rss[cycle] = runtime.inspect("bytes")["wg0"]["rss_bytes"]
            moves[cycle] = len(runtime.inspect("transitions"))
    print(f"rss after cycle 5 {rss[5]} B, after cycle 50 {rss[50]} B; moves {moves}")
    assert moves[50] - moves[5] >= 45 * 2 * 8          # every State of both jobs, both ways
    assert abs(rss[50] - rss[5]) <= 0.05 * rss[5], rss
