"""A run's call log exported as a [measured] scenario (plexrl/sim/experiments/from_run.py) loads, and
its replay (plexrl/sim/experiments/measured.py) reproduces what a synthetic log says and predicts sharing.

Synthetic logs: each job's step is the five GRPO calls, each issued a known gap after the
previous result and taking a known time, one at a time, as bench/multiplexing.py's driver
does. With the job alone and memory to spare, the replay must give back the log's held
seconds and step time exactly; together, jobs must share the idle time.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plexrl.cli import main as cli_main
from plexrl.errors import ConfigError
from plexrl.protocol import ModelSpec
from plexrl.sim.experiments.from_run import RunInfo, export, job_shape
from plexrl.sim.experiments.measured import predict
from plexrl.sim.scenario import load_scenario

FUNCTIONS = ("generate", "logprobs", "forward_backward", "optim_step", "sync_weights")
SPEC = ModelSpec(name="policy", total_params=1000.0, active_params=1000.0, num_layers=2,
                 kv_heads=2, head_dim=16, dtype_bytes=4, kv_cache_tokens=0)
WORKSPACE = (3000, 2000, 6000, 0, 0)
MOVES = [{"job": "a", "src": "host", "dst": "device", "num_bytes": 4000, "seconds": 2e-6},
         {"job": "a", "src": "device", "dst": "host", "num_bytes": 4000, "seconds": 4e-6}]


def synthetic_log(job: str, durations, gaps, steps: int, compute_frac: float = 0.8) -> list[dict]:
    """A call log of ``steps`` steps: call i queued ``gaps[i]`` after the previous result,
    dispatched at once, holding the group ``durations[i]``."""
    calls, now = [], 100.0
    for step in range(steps):
        for i, function in enumerate(FUNCTIONS):
            now += gaps[i]
            calls.append({"call": len(calls), "job": job, "seq": len(calls),
                          "function": function, "role": "policy", "step": step, "wg": "wg0",
                          "queued_s": now, "start_s": now, "end_s": now + durations[i],
                          "duration_s": durations[i] * compute_frac,
                          "workspace_bytes": WORKSPACE[i], "failed": ""})
            now += durations[i]
    return calls


def write(tmp_path, calls, jobs=("a",), warmup=2, steps=4, device_bytes=10**6, name="run.toml"):
    info = RunInfo(run="a synthetic log", models={j: SPEC for j in jobs}, warmup=warmup,
                   timed_steps=steps, device_bytes=device_bytes)
    path = tmp_path / name
    path.write_text(export(calls, MOVES, info))
    return path


DURATIONS = (0.12, 0.03, 0.05, 0.006, 0.005)
GAPS = (0.003, 0.2, 0.008, 0.003, 0.003)


def test_the_exported_scenario_carries_the_logs_means_and_moves(tmp_path):
    s = load_scenario(str(write(tmp_path, synthetic_log("a", DURATIONS, GAPS, 6))))
    job = s.measured.jobs["a"]
    assert job.functions == FUNCTIONS
    assert job.duration_s == pytest.approx(DURATIONS)
    assert job.compute_s == pytest.approx([0.8 * d for d in DURATIONS])
    assert job.gap_s == pytest.approx(GAPS)
    assert job.workspace_bytes == WORKSPACE
    assert s.measured.onload_bytes_per_s == pytest.approx(2e9)
    assert s.measured.offload_bytes_per_s == pytest.approx(1e9)
    # the round trip of the calls without tensors: dispatch to result less compute
    assert s.measured.move_latency_s == pytest.approx(0.2 * 0.0055, rel=0.1)
    assert (s.warmup_steps, s.num_steps) == (2, 6)
    assert s.models["a"].spec().kv_cache_tokens == 0
    text = (tmp_path / "run.toml").read_text()
    assert all("# " in line for line in text.splitlines() if " = " in line)


@given(durations=st.tuples(*[st.floats(0.001, 0.3)] * 5), gaps=st.tuples(*[st.floats(0.0, 0.3)] * 5),
       steps=st.integers(1, 4))
def test_a_job_alone_replays_its_logs_held_seconds_and_step_time(tmp_path_factory, durations,
                                                                  gaps, steps):
    tmp_path = tmp_path_factory.mktemp("alone")
    calls = synthetic_log("a", durations, gaps, 2 + steps)
    report = predict(load_scenario(str(write(tmp_path, calls, steps=steps))))
    step_s = sum(durations) + sum(gaps)
    held_s = steps * step_s - gaps[0]      # first timed call's start to last call's end
    assert report["isolated"]["device_s_per_step"] == pytest.approx(held_s / steps, rel=1e-6)
    assert report["isolated"]["jobs"]["a"]["mean_step_s"] == pytest.approx(step_s, rel=1e-6)
    assert report["shared"]["jobs"]["a"]["slowdown"] == pytest.approx(1.0, rel=1e-6)


def test_jobs_with_idle_gaps_share_the_group_for_fewer_device_seconds(tmp_path):
    calls = synthetic_log("a", DURATIONS, GAPS, 8) + synthetic_log("b", DURATIONS, GAPS, 8)
    report = predict(load_scenario(str(write(tmp_path, calls, jobs=("a", "b"), steps=6))))
    busy = sum(DURATIONS)
    alone = report["isolated"]["jobs"]["a"]
    assert alone["idle_share"] == pytest.approx(1 - busy / (sum(DURATIONS) + sum(GAPS)), abs=0.01)
    shared = report["shared"]
    assert shared["device_s_per_step"] < report["isolated"]["device_s_per_step"]
    # the group ran every call of both: held time is at least the busy time
    assert shared["device_s"] >= shared["busy_s"] >= 2 * 6 * busy * (1 - 1e-9)
    for job in ("a", "b"):
        assert shared["jobs"][job]["slowdown"] >= 1 - 1e-9


def test_a_budget_that_holds_one_job_moves_states_at_every_switch(tmp_path):
    calls = synthetic_log("a", DURATIONS, GAPS, 6) + synthetic_log("b", DURATIONS, GAPS, 6)
    roomy = predict(load_scenario(str(write(tmp_path, calls, jobs=("a", "b"), name="r.toml"))))
    # the largest call's reserve and 1.5 jobs' States (4000 + 4000 + 8004 + 4000 bytes)
    tight = predict(load_scenario(str(write(tmp_path, calls, jobs=("a", "b"), name="t.toml",
                                            device_bytes=6000 + 30000))))
    assert roomy["shared"]["moves"] == 0
    assert tight["shared"]["moves"] > 0 and tight["shared"]["move_bytes"] > 0
    assert tight["shared"]["device_s"] > roomy["shared"]["device_s"]


def test_steps_that_make_different_calls_are_refused():
    calls = synthetic_log("a", DURATIONS, GAPS, 4)
    calls = [c for c in calls if not (c["step"] == 3 and c["function"] == "logprobs")]
    with pytest.raises(ValueError, match="different calls"):
        job_shape(calls, "a", 1)


def test_a_list_of_the_wrong_length_names_its_field(tmp_path):
    path = write(tmp_path, synthetic_log("a", DURATIONS, GAPS, 6))
    text = path.read_text().replace("gap_s = [", "gap_s = [0.5, ")
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_scenario(str(path))
    assert err.value.field == "measured.jobs.a.gap_s"


def test_plexrl_sim_prints_the_prediction_of_a_measured_scenario(tmp_path, capsys):
    path = write(tmp_path, synthetic_log("a", DURATIONS, GAPS, 6))
    assert cli_main.main(["sim", str(path), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) >= {"isolated", "shared", "device_s_saving_frac", "max_slowdown"}
    assert report["isolated"]["device_s_per_step"] > 0
