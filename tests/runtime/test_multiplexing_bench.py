"""The multiplexing bench's core runs end to end with tiny step counts and reports its fields.

Timing on a shared 2-core machine is not asserted: no target, no idle-share band.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest

BENCH = Path(__file__).parents[2] / "bench" / "multiplexing.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("multiplexing_bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench           # its dataclasses look their module up by name
    spec.loader.exec_module(bench)
    return bench


def test_the_multiplexing_bench_reports_device_seconds_slowdowns_and_swaps(ray_session):
    bench = load_bench()
    plans = tuple(replace(p, prompts=p.prompts[:2], group=2, max_tokens=4) for p in bench.JOBS)
    result = bench.measure(plans, warmup=2, steps=2, rounds=2)   # one timed step per round
    names = [p.name for p in plans]
    assert result["rounds"] == 2
    assert sorted(result["idle_share_isolated"]) == sorted(names)
    for mode in ("isolated", "shared"):
        assert result[mode]["num_devices"] == 1
        assert result[mode]["device_s"] > 0 and result[mode]["device_s_per_step"] > 0
    for name in names:   # the rounds are reported under the jobs' own names
        assert result["isolated"]["jobs"][name]["mean_step_s"] > 0
        assert 0 < result["isolated"]["jobs"][name]["busy_s"] <= result["isolated"]["jobs"][name]["held_s"]
        assert result["shared"]["jobs"][name]["slowdown"] > 0
    for row in result["jobs"]:
        assert row["reward_s"] >= 0 and row["tool_s"] >= 0
    assert result["jobs"][0]["tool_s"] == 0 and result["jobs"][1]["tool_s"] > 0
    # the shared budget cannot hold every job's States beside the largest call: switches move
    # bytes, and the bench counts them
    assert result["device"]["holds_all_states_beside_largest_call"] is False
    assert result["shared"]["transitions"]["count_all"] > 0
    assert result["shared"]["transitions"]["bytes_all"] > 0
    for key in ("device_s_saving_frac", "max_slowdown", "slowdown_floor_est", "targets",
                "meets_saving", "meets_slowdown", "idle_share_ok"):
        assert key in result
    assert result["compute_inflation"] == pytest.approx(
        result["shared"]["compute_s"] / sum(j["compute_s"] for j in result["isolated"]["jobs"].values()),
        rel=1e-3)
    assert result["slowdown_floor_measured"] == pytest.approx(
        result["compute_inflation"] * result["slowdown_floor_est"], rel=1e-3)
    alone, shared = result["isolated"]["jobs"], result["shared"]["jobs"]
    paces = [shared[name]["mean_step_s"] for name in names]
    assert result["shared_pace_spread"] == pytest.approx(max(paces) / min(paces), rel=1e-3)
    assert result["slowdown_floor_one_pace"] == pytest.approx(
        sum(alone[name]["busy_s"] for name in names) / 2 / min(alone[n]["mean_step_s"] for n in names),
        rel=1e-3)


def test_rounds_must_divide_the_timed_steps():
    bench = load_bench()
    with pytest.raises(ValueError, match="multiple of --rounds"):
        bench.measure(bench.JOBS, warmup=1, steps=3, rounds=2)
