"""The controller's journal (SQLite, WAL) and a service's record of recent calls, without Ray."""

from __future__ import annotations

import pickle

import pytest

from plexrl.protocol import CallRequest, Copy, Function, JobRequest, ModelSpec, Role
from plexrl.runtime.control.journal import Journal
from plexrl.runtime.workers.recent import CallRecords, Outcome

SPEC = ModelSpec(name="m", total_params=1e3, active_params=1e3, num_layers=1, kv_heads=1,
                 head_dim=4, source="simulated")


def _job(name="a", save_interval=0):
    return JobRequest(name, ((Role.POLICY, SPEC),), seed=1, save_interval=save_interval)


def _call(seq, job="a", function=Function.LOGPROBS, token="t"):
    return CallRequest(job, token, seq, function, Role.POLICY)


def test_the_journal_is_in_wal_mode_and_outlives_its_connection(tmp_path):
    journal = Journal(tmp_path)
    assert journal.mode == "wal"
    journal.add_job(_job(), "t", "s1")
    journal.bind("a", {(Role.POLICY, Copy.TRAINER): "wg0"})
    assert journal.submitted(_call(0))
    journal.close()
    again = Journal(tmp_path)
    assert [j.status for j in again.jobs()] == ["running"]
    assert again.bindings("a") == {("policy", "trainer"): "wg0"}
    assert again.call("a", 0).request == _call(0) and again.call("a", 0).status == "submitted"


def test_a_call_id_is_recorded_once_and_ends_once(tmp_path):
    journal = Journal(tmp_path)
    journal.add_job(_job(), "t", "s1")
    assert journal.submitted(_call(0)) and not journal.submitted(_call(0))   # a resend
    journal.dispatching("a", 0, call=7, copy_seq=0, wg="wg0")
    assert journal.call("a", 0).status == "dispatched" and journal.max_call_id() == 7
    assert journal.finish("a", 0, "done")
    assert not journal.finish("a", 0, "failed")         # a second end writes nothing
    assert journal.outcomes() == [("a", 0, "done")]


def test_ending_a_job_cancels_its_open_calls_and_a_new_job_of_its_name_starts_clean(tmp_path):
    journal = Journal(tmp_path)
    journal.add_job(_job(), "token-one", "s1")
    for seq in range(3):
        journal.submitted(_call(seq))
    journal.finish("a", 0, "done")
    journal.end_job("a", "lease expired")
    assert [status for *_, status in journal.outcomes()] == ["done", "cancelled", "cancelled"]
    journal.add_job(_job(), "token-two", "s1")
    assert journal.calls("a") == [] and journal.submitted(_call(0, token="token-two"))
    assert {c.job for c in journal.calls()} == {"a", "a#token-on"}


def test_a_new_session_interrupts_the_jobs_of_the_old_one_and_keeps_their_checkpoints(tmp_path):
    journal = Journal(tmp_path)
    journal.add_job(_job(save_interval=2), "t", "old")
    journal.bind("a", {(Role.POLICY, Copy.TRAINER): "wg0"})
    journal.checkpoint("a", "policy", 2, "/ckpt/a-v2")
    journal.checkpoint("a", "policy", 4, "/ckpt/a-v4")
    assert journal.interrupt("new") == ["a"]
    assert [j.status for j in journal.jobs()] == ["interrupted"]
    assert journal.last_checkpoint("a").version == 4
    assert journal.bindings("a") == {}


def test_a_service_answers_a_repeat_from_its_bounded_record_and_counts_versions():
    records = CallRecords(limit=3)
    for seq, function in enumerate([Function.OPTIM_STEP, Function.OPTIM_STEP,
                                    Function.SYNC_WEIGHTS, Function.LOGPROBS]):
        request = CallRequest("a", "t", seq, function, Role.POLICY, version=2)
        records.executed("a", seq)
        records.finished(request, Outcome(result={"seq": seq}, record={"failed": ""}))
    assert records.get("a", 0) is None                    # the oldest fell out of the record
    assert records.get("a", 3).result == {"seq": 3}
    assert records.versions[("a", "policy")] == {"trainer": 2, "rollout": 2}
    assert records.repeated() == []
    records.executed("a", 3)
    assert records.repeated() == [("a", 3)]
    assert sorted(records.of_job("a")) == [1, 2, 3]


def test_journaled_requests_keep_no_payload(tmp_path):
    journal = Journal(tmp_path)
    journal.add_job(_job(), "t", "s1")
    bare = _call(0)
    journal.submitted(bare)
    assert pickle.loads(pickle.dumps(journal.call("a", 0).request)).payload is None
    with pytest.raises(AssertionError):
        journal.finish("a", 0, "no-such-status")
