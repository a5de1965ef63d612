"""Sharing a worker group changes no result: two jobs swapped through one group's device
budget end bitwise where each ends alone (DESIGN.md section 5).

Setup: one worker group whose budget fits one job's States and its largest call's
workspace, not a second job's smallest State; the two jobs take turns, a whole step each
(A0 B0 A1 B1 ... A5), so every State of the job that waits is pushed out by the other. "Alone"
is the same job through the same runtime path and configuration, with nobody else bound.
The same holds on a worker group of 2 ranks (each State sharded over both), where each call
also reserves the gathered whole weights, so the budget keeps part of the other job resident:
there the test asks that both jobs were swapped, not that every State went every step.
"""

from __future__ import annotations

import numpy as np
import pytest
from safetensors.torch import load_file

import grpo_like
from plexrl.runtime.models import model_spec

SPEC = model_spec("policy", source="tiny-qwen2")
P = int(SPEC.total_params)
JOB_BYTES = 4 * P + 4 * P + (8 * P + 4) + 4 * P     # trainer weights, grads, optimizer; rollout weights
WORKSPACE = 300_000                                  # the largest call's reserve is below this
BUDGET = JOB_BYTES + WORKSPACE
STEPS = {"a": 6, "b": 5}
STEPS_2_RANKS = {"a": 3, "b": 2}   # two ranks on two cores are slow: fewer steps
SEEDS = {"a": 1, "b": 2}


def _run(runtime, order, tmp_path, tag):
    """Run the jobs' steps in ``order``; returns per-job step records, saved state, windows."""
    jobs = {name: runtime.register_job(name, {"policy": SPEC}, seed=SEEDS[name])
            for name in {name for name, _ in order}}
    steps = {name: [] for name in jobs}
    windows = []
    import time
    for name, k in order:
        start = time.monotonic()
        steps[name].append(grpo_like.step(jobs[name], k))
        windows.append((name, k, start, time.monotonic()))
    saved = {}
    for name, job in jobs.items():
        path = tmp_path / f"{tag}-{name}.safetensors"
        job.save(str(path)).result()
        saved[name] = load_file(str(path))
    return steps, saved, windows


def _group(ranks: int) -> dict:
    """The runtime settings of one worker group of ``ranks`` devices that fits one job and
    its largest call (with the gathered weights on several ranks), not both jobs."""
    budget = BUDGET if ranks == 1 else -(-(BUDGET + 4 * P) // ranks) + 64
    return {"groups": (("wg0", ranks),), "device_bytes": budget}


def _alone(connect, tmp_path, ranks: int = 1, plan=STEPS, **settings):
    runtime = connect(**_group(ranks), **settings)
    out = {}
    for name, steps in plan.items():
        records, saved, _ = _run(runtime, [(name, k) for k in range(steps)], tmp_path, "alone")
        out[name] = (records[name], saved[name])
        runtime.register_job  # the job stays registered; its states stay on this group
    return out


def _interleaved(plan=STEPS):
    order = []
    for k in range(max(plan.values())):
        order += [(name, k) for name in ("a", "b") if k < plan[name]]
    return order


def _same(x, y) -> bool:
    return all(np.array_equal(x[key], y[key]) for key in ("tokens", "gen_logprobs",
                                                          "old_logprobs"))


def test_budget_fits_one_job_but_not_a_state_of_the_other():
    assert JOB_BYTES + WORKSPACE <= BUDGET < JOB_BYTES + 4 * P < 2 * JOB_BYTES


@pytest.mark.parametrize("ranks", [1, 2])
def test_equivalence_shared_group_is_bitwise_equal_to_alone(connect, tmp_path, ranks):
    plan = STEPS if ranks == 1 else STEPS_2_RANKS
    alone = _alone(connect, tmp_path, ranks, plan)
    shared = connect(**_group(ranks))
    steps, saved, windows = _run(shared, _interleaved(plan), tmp_path, "shared")
    for name in plan:
        records, state = alone[name]
        assert len(steps[name]) == plan[name] >= 2
        for k, (solo, both) in enumerate(zip(records, steps[name])):
            assert _same(solo, both), f"job {name} step {k}: tokens or logprobs differ"
        for key in ("weights", "optimizer", "grads", "generator"):
            assert np.array_equal(state[key].numpy(), saved[name][key].numpy()), (name, key)
    moves = shared.inspect("transitions")
    if ranks == 1:
        _every_state_swapped_every_step(moves, windows)
    else:   # each job's States were pushed out by the other's
        assert {m["job"] for m in moves if m["dst"] == "host"} == set(plan), moves


def _every_state_swapped_every_step(moves, windows):
    """Each State of each job is onloaded during each of its steps and offloaded after it
    (before its next step); the run's very last step is followed by nothing."""
    assert moves and all(m["src_ptr"] != m["dst_ptr"] for m in moves), "a move stayed in place"
    states = {"trainer/weights", "trainer/grads", "trainer/optimizer", "rollout/weights"}
    for i, (name, k, start, end) in enumerate(windows):
        mine = [m for m in moves if m["job"] == name]
        onloaded = {m["state"] for m in mine if m["dst"] == "device" and start <= m["end_s"] <= end}
        assert onloaded >= states, f"job {name} step {k}: not onloaded: {states - onloaded}"
        if i + 1 == len(windows):
            break
        later = [w for w in windows[i + 1:] if w[0] == name]
        until = later[0][2] if later else float("inf")
        offloaded = {m["state"] for m in mine
                     if m["dst"] == "host" and end <= m["end_s"] <= until}
        assert offloaded >= states, f"job {name} after step {k}: not offloaded: {states - offloaded}"


def test_equivalence_fails_when_the_optimizer_is_not_restored(connect, tmp_path):
    """The same comparison with onloads that drop the optimizer's bytes: it must fail."""
    alone = _alone(connect, tmp_path)
    broken = connect(device_bytes=BUDGET, skip_onload=("optimizer",))
    steps, saved, _ = _run(broken, _interleaved(), tmp_path, "broken")
    differs = [name for name in STEPS
               if not np.array_equal(alone[name][1]["weights"].numpy(),
                                     saved[name]["weights"].numpy())]
    assert differs, "losing the optimizer state went unnoticed"
