"""The shared-rollout bench runs end to end with tiny step counts and reports its fields.

Timing on a shared 2-core machine is not asserted; where each job's GENERATEs ran is.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).parents[2] / "bench" / "shared_rollout.py"


def test_the_shared_rollout_bench_reports_device_seconds_slowdowns_and_where_rollouts_ran(
        ray_session):
    spec = importlib.util.spec_from_file_location("shared_rollout_bench", BENCH)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    result = bench.measure(steps=1, warmup=1, rounds=1, median=3, cap=4, reward_s=0.0)
    assert set(result["saving"]) == set(result["slowdown"]) == {"shared", "shared-rows"}
    private = result["private"]["rollout_groups_of"]
    assert sorted(g for groups in private.values() for g in groups) == ["roll0", "roll1",
                                                                         "roll2"]
    for mode in ("shared", "shared-rows"):   # every job's GENERATEs on both shared groups
        assert all(groups == ["roll0", "roll1"]
                   for groups in result[mode]["rollout_groups_of"].values())
        assert result[mode]["devices"] == 3 and result[mode]["device_s_per_step"] > 0
        assert all(s > 0 for s in result["slowdown"][mode].values())
    assert result["private"]["devices"] == 4
