"""Table-driven tests of the three queue policies on hand-built ``Candidate`` lists.

A row names the policy, the candidates (call id, job, queued_at, service s, switch s), the
last job served, ``max_wait_s``, and the call id the policy must pick. ``now`` is fixed at
100 s, so a candidate's wait is ``100 - queued_at``.
"""

from __future__ import annotations

import pytest

from plexrl.core.queues import QUEUES, Candidate, HrrsQueue, queue_by_name, ratio
from plexrl.core.snapshot import CallView
from plexrl.errors import ConfigError, PlexError
from plexrl.protocol import Function

NOW = 100.0


def cand(call: int, job: str = "a", queued_at: float = 0.0, service_s: float = 1.0,
         switch_s: float = 0.0) -> Candidate:
    view = CallView(call=call, job=job, seq=0, function=Function.LOGPROBS, role="policy",
                    wg="g0", queued_at=queued_at)
    return Candidate(view, NOW - queued_at, service_s, switch_s)


ROWS = [
    # ---- fcfs: the oldest call, ties by call id; cost and job do not matter
    ("fcfs", "oldest wins", [cand(3, queued_at=5), cand(1, queued_at=9), cand(2, queued_at=7)],
     None, 600, 3),
    ("fcfs", "tie by call id", [cand(8, queued_at=5), cand(4, queued_at=5), cand(6, queued_at=5)],
     None, 600, 4),
    ("fcfs", "ignores cost", [cand(1, queued_at=5, service_s=1e6, switch_s=1e6),
                              cand(2, queued_at=6, service_s=0.1)], None, 600, 1),
    ("fcfs", "ignores last job", [cand(1, "a", 5), cand(2, "b", 6)], "b", 600, 1),
    # ---- round-robin: the first job after last_job (by id), its oldest call
    ("round-robin", "no last job: first job", [cand(2, "b", 1), cand(1, "a", 9)], None, 600, 1),
    ("round-robin", "after a comes b", [cand(1, "a", 0), cand(2, "b", 9), cand(3, "c", 1)],
     "a", 600, 2),
    ("round-robin", "after b comes c", [cand(1, "a", 0), cand(2, "b", 9), cand(3, "c", 1)],
     "b", 600, 3),
    ("round-robin", "after the last job wraps to the first", [cand(1, "a", 9), cand(2, "b", 0),
                                                              cand(3, "c", 1)], "c", 600, 1),
    ("round-robin", "last job absent: next one after it",
     [cand(1, "a", 0), cand(3, "c", 1)], "b", 600, 3),
    ("round-robin", "oldest call of the job in turn",
     [cand(5, "b", 7), cand(4, "b", 3), cand(6, "b", 3), cand(1, "a", 0)], "a", 600, 4),
    ("round-robin", "only the last job left", [cand(1, "a", 5), cand(2, "a", 1)], "a", 600, 2),
    # ---- hrrs: (wait + S) / (S + X); ties by X, then arrival; overdue first, FCFS
    ("hrrs", "resident beats equal non-resident",
     [cand(1, queued_at=50, switch_s=5.0), cand(2, queued_at=50, switch_s=0.0)], None, 600, 2),
    ("hrrs", "resident beats an older non-resident",
     [cand(1, queued_at=49, switch_s=5.0), cand(2, queued_at=50, switch_s=0.0)], None, 600, 2),
    ("hrrs", "short passes long of equal wait",
     [cand(1, queued_at=90, service_s=100.0), cand(2, queued_at=90, service_s=1.0)], None, 600, 2),
    ("hrrs", "waiting raises the ratio",
     [cand(1, queued_at=95), cand(2, queued_at=20)], None, 600, 2),
    ("hrrs", "a long wait overtakes a short service",
     [cand(1, queued_at=99, service_s=1.0), cand(2, queued_at=0, service_s=30.0)], None, 600, 2),
    ("hrrs", "equal ratio and switch: older first",
     [cand(2, queued_at=50), cand(1, queued_at=60), cand(3, queued_at=50)], None, 600, 2),
    ("hrrs", "overdue goes first despite a lower ratio",
     [cand(1, queued_at=0, service_s=1e6, switch_s=1e6), cand(2, queued_at=80, switch_s=0.0)],
     None, 50, 1),
    ("hrrs", "overdue calls FCFS among themselves",
     [cand(1, queued_at=20, service_s=0.1), cand(2, queued_at=10, service_s=1e4),
      cand(3, queued_at=90, service_s=0.01)], None, 50, 2),
    ("hrrs", "a wait equal to max_wait_s is not overdue",
     [cand(1, queued_at=50, service_s=1e6), cand(2, queued_at=60, service_s=1.0)], None, 50, 2),
]


@pytest.mark.parametrize("policy, why, candidates, last_job, max_wait_s, expected",
                         ROWS, ids=[f"{r[0]}: {r[1]}" for r in ROWS])
def test_pick(policy, why, candidates, last_job, max_wait_s, expected):
    queue = queue_by_name(policy)
    picked = queue.pick(candidates, last_job, max_wait_s)
    assert picked.call.call == expected, why
    # the pick does not depend on the order the candidates are listed in
    assert queue.pick(list(reversed(candidates)), last_job, max_wait_s).call.call == expected


def test_table_covers_every_policy():
    assert {r[0] for r in ROWS} == set(QUEUES)


def test_round_robin_takes_turns_over_a_sequence_of_picks():
    queue = queue_by_name("round-robin")
    pending = [cand(i, job, queued_at=i) for i, job in enumerate("aabbbc")]
    served, last = [], None
    while pending:
        picked = queue.pick(pending, last, 600)
        served.append(picked.call.job)
        last = picked.call.job
        pending.remove(picked)
    assert "".join(served) == "abcabb"


def test_hrrs_ratio_formula():
    c = cand(1, queued_at=NOW - 9.0, service_s=3.0, switch_s=1.0)
    assert ratio(c) == pytest.approx((9.0 + 3.0) / (3.0 + 1.0))
    assert ratio(cand(1, service_s=0.0, switch_s=0.0)) == float("inf")
    # waiting raises every ratio; a switch cost lowers it
    assert ratio(cand(1, queued_at=10)) > ratio(cand(1, queued_at=20))
    assert ratio(cand(1, switch_s=0.0)) > ratio(cand(1, switch_s=2.0))


def test_hrrs_never_starves_a_call_past_max_wait():
    """A long, non-resident call loses to a stream of short resident ones until it is overdue."""
    hrrs = HrrsQueue()
    victim_queued_at = 0.0
    for now in range(0, 200, 5):
        victim = Candidate(CallView(1, "a", 0, Function.FORWARD_BACKWARD, "policy", "g0",
                                    victim_queued_at), now - victim_queued_at, 50.0, 20.0)
        fresh = Candidate(CallView(2, "b", 0, Function.LOGPROBS, "policy", "g0", now - 1.0),
                          1.0, 0.1, 0.0)
        picked = hrrs.pick([victim, fresh], "b", max_wait_s=120.0)
        assert picked.call.call == (1 if now > 120.0 else 2), now


def test_queue_by_name_returns_the_named_policy():
    for name in ("fcfs", "round-robin", "hrrs"):
        assert queue_by_name(name).name == name


@pytest.mark.parametrize("name", ["lifo", "HRRS", "", "round_robin"])
def test_unknown_queue_policy_is_a_config_error_naming_the_valid_ones(name):
    with pytest.raises(ConfigError) as info:
        queue_by_name(name)
    err = info.value
    assert isinstance(err, PlexError) and isinstance(err, ValueError)
    assert err.field == "queue_policy" and err.value == name
    for valid in ("fcfs", "hrrs", "round-robin"):
        assert valid in str(err)
    assert repr(name) in str(err)


def train(call: int, job: str, function: Function, step: int, *, role: str = "policy",
          queued_at: float = 0.0, service_s: float = 1.0) -> Candidate:
    view = CallView(call=call, job=job, seq=0, function=function, role=role, wg="g0",
                    queued_at=queued_at, step=step)
    return Candidate(view, NOW - queued_at, service_s, 0.0)


LP, FB, OPT = Function.LOGPROBS, Function.FORWARD_BACKWARD, Function.OPTIM_STEP
BATCH_ROWS = [
    # (why, candidates, last_job, expected pick); b's call always has the higher ratio
    ("the last job's FORWARD_BACKWARD goes on", [train(1, "a", FB, 3, queued_at=90, service_s=10),
                                                  train(2, "b", LP, 5)], "a", 1),
    ("the last job's OPTIM_STEP goes on", [train(1, "a", OPT, 3, queued_at=90, service_s=10),
                                            train(2, "b", LP, 5)], "a", 1),
    ("its next step's policy LOGPROBS competes", [train(1, "a", LP, 4, queued_at=90),
                                                   train(2, "b", LP, 5)], "a", 2),
    ("a reference LOGPROBS whose policy LOGPROBS went goes on",
     [train(1, "a", LP, 3, role="reference", queued_at=90), train(2, "b", LP, 5)], "a", 1),
    ("a reference LOGPROBS beside its step's policy LOGPROBS competes",
     [train(1, "a", LP, 4, role="reference", queued_at=90), train(3, "a", LP, 4, queued_at=90),
      train(2, "b", LP, 5)], "a", 2),
    ("within the batch the ratio chooses", [train(1, "a", FB, 3, queued_at=90, service_s=10),
                                            train(3, "a", LP, 3, role="reference", queued_at=90),
                                            train(2, "b", LP, 5)], "a", 3),
    ("another job's batch does not hold the group", [train(1, "a", FB, 3, queued_at=90, service_s=10),
                                                     train(2, "b", LP, 5)], "c", 2),
]


@pytest.mark.parametrize("why, candidates, last_job, expected", BATCH_ROWS,
                         ids=[r[0] for r in BATCH_ROWS])
def test_hrrs_keeps_one_steps_batch_together_and_no_more(why, candidates, last_job, expected):
    hrrs = HrrsQueue()
    assert hrrs.pick(candidates, last_job, 600.0).call.call == expected, why
    assert hrrs.pick(list(reversed(candidates)), last_job, 600.0).call.call == expected, why
