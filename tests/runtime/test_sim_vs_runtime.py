"""One short real run of the multiplexing bench's jobs (tiny models, few steps) exported from
its isolated runs as a scenario and simulated: the prediction holds against the measurement.

The run uses the default 256 MiB device (all States fit: no switch moves, whose stall the
replay under-predicts, docs/design.md D152). Bounds, loose on purpose (a shared
2-core machine; bench/sim_vs_runtime.py is the real check, 20%): device-seconds per training
step within 50% alone (a replay of the same calls) and shared when each call takes its
shared duration (the model of queueing; the machine's speed may drift between the two
phases, D152); the prediction from the isolated runs alone orders shared below isolated.
The measured order is the bench's to report, not this test's: the suite's other worker can
double the shared phase's wall time (D216). No wall-time figure is asserted as such.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from dataclasses import replace
from pathlib import Path

from plexrl.sim.scenario import load_scenario

BENCH = Path(__file__).parents[2] / "bench"
BOUND = 0.5


def load_bench():
    """bench/sim_vs_runtime.py, which imports bench/multiplexing.py as ``multiplexing``."""
    for name in ("multiplexing", "sim_vs_runtime"):
        spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module            # its dataclasses look their module up by name
        spec.loader.exec_module(module)
    return module


def test_a_short_run_exported_from_its_isolated_runs_predicts_its_device_seconds(ray_session,
                                                                                  tmp_path):
    """Exported, loaded, simulated through ``plexrl sim``; figures within the bounds."""
    svr = load_bench()
    plans = tuple(replace(p, prompts=p.prompts[:2], group=2, max_tokens=4) for p in svr.mx.JOBS)
    result = svr.check(plans, warmup=2, steps=3, out=tmp_path, swap=False)
    (tmp_path / "result.json").write_text(json.dumps(result))
    scenario = load_scenario(result["scenario"])
    assert sorted(scenario.measured.jobs) == sorted(p.name for p in plans)
    assert scenario.measured.device_bytes == result["measured"]["device"]["device_bytes"]
    figures, diagnostic = result["figures"], result["diagnostics"]["shared-durations"]["figures"]
    assert abs(figures["isolated_device_s_per_step"]["rel_error"]) <= BOUND, figures
    assert abs(diagnostic["shared_device_s_per_step"]["rel_error"]) <= BOUND, diagnostic
    predicted = result["predicted"]
    assert predicted["shared"]["device_s_per_step"] < predicted["isolated"]["device_s_per_step"]
    for plan in plans:
        assert predicted["shared"]["jobs"][plan.name]["slowdown"] >= 1.0
