"""When a call became runnable (plexrl/sim/experiments/readiness.py), and the rollout memo the queue
study shares between runs (SimJob.rollout_memo)."""

from __future__ import annotations

import dataclasses

import pytest

from plexrl.core.snapshot import CallView
from plexrl.protocol import Function, Role
from plexrl.sim.experiments.experiment import core_config, fixed_sizes
from plexrl.sim.experiments.loop import CallRecord
from plexrl.sim.experiments.modes import build_layout
from plexrl.sim.experiments.queue_study import MODE, at_load
from plexrl.sim.experiments.readiness import readiness, simulate_recorded
from plexrl.sim.scenario import load_scenario


def call(cid: int, job: str, seq: int, function: Function, queued: float, start: float,
         end: float, role: Role = Role.POLICY) -> tuple[CallRecord, CallView]:
    record = CallRecord("g0", job, function, 0, start, end, 0.0, queued)
    view = CallView(cid, job, seq, function, role, "g0", queued, started_at=start)
    return record, view


def test_ready_is_the_end_of_the_previous_call_on_the_same_copy_or_the_queue_time():
    pairs = [call(1, "a", 0, Function.LOGPROBS, 0.0, 5.0, 8.0),                  # waited behind b
             call(2, "a", 1, Function.FORWARD_BACKWARD, 0.0, 9.0, 20.0),         # blocked by 1 until 8
             call(3, "a", 0, Function.LOGPROBS, 0.0, 20.0, 22.0, Role.REFERENCE),  # its own copy
             call(4, "a", 2, Function.OPTIM_STEP, 21.0, 22.0, 23.0)]             # queued after 2 ended
    out = readiness([r for r, _ in pairs], [v for _, v in pairs])
    assert [d.ready_s for d in out] == [0.0, 8.0, 0.0, 21.0]
    assert [d.wait_ready_s for d in out] == [5.0, 1.0, 20.0, 1.0]
    assert [d.wait_s for d in out] == [5.0, 9.0, 20.0, 1.0]


def test_readiness_refuses_records_and_views_that_do_not_match():
    record, view = call(1, "a", 0, Function.LOGPROBS, 0.0, 5.0, 8.0)
    with pytest.raises(ValueError):
        readiness([record], [dataclasses.replace(view, started_at=4.0)])
    with pytest.raises(ValueError):
        readiness([record], [])


@pytest.fixture(scope="module")
def agentic():
    s = at_load(load_scenario("queues-agentic", ("num_steps=4",)), 5.0, "hrrs")
    workloads = next(iter(s.experiments.values())).workloads
    return s, workloads, fixed_sizes(s.sizes["qwen7b"])


def test_every_simulated_call_waits_between_zero_and_its_wait_since_queued(agentic):
    s, workloads, sizes = agentic
    trace, calls = simulate_recorded(build_layout(s, MODE, workloads, sizes, s.seed), core_config(s))
    assert len(calls) == len(trace.calls) > 0
    ends = {(d.record.job, d.role, d.copy, d.seq): d.record.end_s for d in calls}
    for d in calls:
        assert 0.0 <= d.wait_ready_s <= d.wait_s
        assert d.ready_s == max(d.record.queued_s, ends.get((d.record.job, d.role, d.copy, d.seq - 1),
                                                            d.record.queued_s))
    # some call did wait behind its own job's previous call on the copy
    assert any(d.ready_s > d.record.queued_s for d in calls)


def _run(s, workloads, sizes, memo):
    layout = build_layout(s, MODE, workloads, sizes, s.seed)
    for job in layout.jobs.values():
        job.rollout_memo = memo
    trace, _ = simulate_recorded(layout, core_config(s))
    return trace.calls, {j: (job.log.step_end, job.log.decode_efficiency) for j, job in layout.jobs.items()}


def test_the_rollout_memo_changes_no_figure_of_a_run(agentic):
    """Shared by runs at another think time and policy, as the queue study shares it."""
    s, workloads, sizes = agentic
    memo: dict = {}
    other = at_load(s, 90.0, "fcfs")
    first = _run(other, workloads, sizes, memo)
    assert memo, "the memo was not used"
    filled = len(memo)
    assert _run(s, workloads, sizes, memo) == _run(s, workloads, sizes, None)
    assert first == _run(other, workloads, sizes, None)
    assert len(memo) >= filled
