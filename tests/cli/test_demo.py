"""``plexrl demo`` internals at a tiny size (hidden ``scale``) on the session Ray cluster:
the isolated record, the shared run against it (outputs exist, the comparison is printed),
a fresh ``--out`` that records its baseline first, and the refusal of a record made with
another config. No learning target and no timing is asserted."""

from __future__ import annotations

import io
import json

import pytest

from plexrl.demo import record as rec
from plexrl.demo.main import run_demo
from plexrl.demo.plan import GYM_TASKS, config_hash, demo_jobs
from plexrl.errors import ConfigError

SCALE = 0.05        #: 5 GRPO steps and 2+ warm-up steps a job at --quick


def test_demo_records_isolated_then_compares_the_shared_run(ray_session, tmp_path):
    out = io.StringIO()
    assert run_demo(quick=True, out=tmp_path, isolated=True, record=True, scale=SCALE,
                    stream=out) == 0
    record = json.loads((tmp_path / rec.RECORD).read_text())
    jobs = demo_jobs(True, SCALE)
    assert record["stamp"] == rec.stamp(jobs)
    assert set(record["jobs"]) == {j.name for j in jobs} and len(jobs) >= 3
    assert any(j.task in GYM_TASKS for j in jobs)
    assert all(len(record["jobs"][j.name]["rewards"]) == j.steps for j in jobs)
    out = io.StringIO()
    assert run_demo(quick=True, out=tmp_path, isolated=False, record=False, scale=SCALE,
                    stream=out) == 0
    text = out.getvalue()
    for phrase in ("slowdown", "saving", "utilisation", "device-s/step", "acc after warm-up"):
        assert phrase in text
    for name in ("reward-curves.png", "timeline-shared.json", "timeline-isolated.json",
                 "summary.json"):
        assert (tmp_path / name).stat().st_size > 0
    trace = json.loads((tmp_path / "timeline-shared.json").read_text())
    categories = {e.get("cat") for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert {j.name for j in jobs} <= categories
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["comparison"]["slowdown"].keys() == {j.name for j in jobs}


def test_a_fresh_out_records_the_baseline_first_then_compares(ray_session, tmp_path):
    out = io.StringIO()
    assert run_demo(quick=True, out=tmp_path, isolated=False, record=False, scale=SCALE,
                    stream=out) == 0
    text = out.getvalue()
    assert "recording it first" in text and "saving:" in text and "verifier" in text
    record = json.loads((tmp_path / rec.RECORD).read_text())
    jobs = demo_jobs(True, SCALE)
    assert record["stamp"] == rec.stamp(jobs) and set(record["jobs"]) == {j.name for j in jobs}
    assert all(0 <= j["idle_share"] < 1 for j in record["usage"]["jobs"].values())
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["comparison"]["idle_share_isolated"].keys() == {j.name for j in jobs}
    trace = json.loads((tmp_path / "timeline-isolated.json").read_text())
    categories = {e.get("cat") for e in trace["traceEvents"] if e.get("ph") == "X"}
    assert categories == {j.name for j in jobs}       # the isolated- prefix is stripped


def test_a_record_of_another_config_is_refused_before_anything_runs(tmp_path):
    jobs = demo_jobs(True, SCALE)
    theirs = {**rec.stamp(jobs), "config_hash": config_hash(demo_jobs(False))}
    rec.write_record(tmp_path, theirs, {"usage": {}, "jobs": {}})
    with pytest.raises(ConfigError, match="config_hash.*--isolated --record"):
        run_demo(quick=True, out=tmp_path, isolated=False, record=False, scale=SCALE,
                 stream=io.StringIO())
    assert sorted(p.name for p in tmp_path.iterdir()) == [rec.RECORD]


def test_a_record_of_other_code_or_seeds_names_what_differs(tmp_path):
    jobs = demo_jobs(True, SCALE)
    theirs = {**rec.stamp(jobs), "code_version": "0.0.0+src.0", "seeds": {"copy": 99}}
    rec.write_record(tmp_path, theirs, {})
    with pytest.raises(ConfigError) as err:
        rec.load_record(tmp_path, rec.stamp(jobs), "plexrl demo --quick")
    assert "code_version" in str(err.value) and "seeds" in str(err.value)
    assert rec.load_record(tmp_path / "none", rec.stamp(jobs), "x") is None
