"""Pipelined dispatch on the runtime (D180): with jobs sharing a group, the controller sends a
call behind the running one, the service runs it there, and no result changes."""

from __future__ import annotations

import threading

import numpy as np

import grpo_like
from plexrl.runtime.models import model_spec

SPEC = model_spec("policy", source="tiny-qwen2")
SEEDS = {"a": 1, "b": 2, "c": 3}
STEPS = 3


def _steps(runtime, names, together: bool) -> dict:
    jobs = {n: runtime.register_job(n, {"policy": SPEC}, seed=SEEDS[n]) for n in names}
    out = {n: [] for n in names}

    def drive(name):
        out[name] = [grpo_like.step(jobs[name], k) for k in range(STEPS)]
    if together:
        threads = [threading.Thread(target=drive, args=(n,)) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        for n in names:
            drive(n)
    return out


def test_calls_sent_behind_run_after_the_running_call_and_change_no_result(connect):
    alone = _steps(connect(pipeline=False), list(SEEDS), together=False)
    shared_runtime = connect()
    shared = _steps(shared_runtime, list(SEEDS), together=True)
    for name in SEEDS:
        for solo, both in zip(alone[name], shared[name]):
            for key in ("tokens", "gen_logprobs", "old_logprobs"):
                assert np.array_equal(solo[key], both[key]), (name, key)
    calls = sorted((c for c in shared_runtime.inspect("calls") if not c["failed"]),
                   key=lambda c: c["start_s"])
    assert any(c["behind"] for c in calls)
    for previous, call in zip(calls, calls[1:]):   # one at a time on the group
        assert call["start_s"] >= previous["end_s"] or not call["behind"], (previous, call)
