"""Job files (plexrl/runtime/submitted/jobspec.py): the shipped examples load; every malformed field is
a ConfigError naming the file, the field, the value and a fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from plexrl.errors import ConfigError
from plexrl.runtime.submitted.jobspec import load_job_file, parse_bytes

ROOT = Path(__file__).resolve().parents[2]
GOOD = """
name = "j1"
priority = 2
save_interval = 5
[entry]
command = ["sleep", "1"]
[models.policy]
source = "tiny-qwen2"
[models.policy.resources]
devices = 2
device_bytes = "1MiB"
"""


@pytest.mark.parametrize("name", ["own-job.toml", "own-job.yaml"])
def test_shipped_job_files_load_and_build_their_model_specs(name):
    job = load_job_file(ROOT / "examples" / "jobs" / name)
    sub = job.submission()
    (role, spec), = sub.request.models
    assert role == "policy" and spec.source == "tiny-qwen2" and spec.dp == 1
    assert sub.argv[0] == "{python}" and sub.argv[-2:] == ("--steps", "3")
    assert Path(sub.argv[2]) == ROOT / "examples" / "own_job.py"


def test_a_good_file_sets_priority_devices_and_bytes(tmp_path):
    path = tmp_path / "j.toml"
    path.write_text(GOOD)
    sub = load_job_file(path).submission()
    assert sub.request.priority == 2 and sub.save_interval == 5
    assert sub.request.models[0][1].dp == 2 and dict(sub.device_bytes) == {"policy": 1 << 20}
    assert sub.argv == ("sleep", "1") and sub.cwd == str(tmp_path)
    assert (sub.request.rollout_lanes, sub.request.rollout_split) == (1, "rows")   # defaults
    path.write_text(GOOD.replace("priority = 2", 'priority = 2\nrollout_lanes = 2\n'
                                 'rollout_split = "calls"'))
    request = load_job_file(path).submission().request
    assert (request.rollout_lanes, request.rollout_split) == (2, "calls")


BAD = [
    # (why, replace this, with this, field named, value shown)
    ("bad name", 'name = "j1"', 'name = "a b"', "name", "a b"),
    ("priority not an int", "priority = 2", 'priority = "high"', "priority", "high"),
    ("negative save interval", "save_interval = 5", "save_interval = -1", "save_interval", "-1"),
    ("unknown top field", "priority = 2", "priority = 2\ngpus = 3", "gpus", "3"),
    ("two entry kinds", 'command = ["sleep", "1"]', 'command = ["x"]\nmodule = "m"', "entry",
     "command"),
    ("missing entry file", 'command = ["sleep", "1"]', 'file = "nope.py"', "entry.file", "nope.py"),
    ("unknown role", "[models.policy]", "[models.critic2]", "models.critic2", "critic2"),
    ("unknown source", 'source = "tiny-qwen2"', 'source = "gpt-17"', "models.policy.source",
     "gpt-17"),
    ("bad head", 'source = "tiny-qwen2"', 'source = "tiny-qwen2"\nhead = "cls"',
     "models.policy.head", "cls"),
    ("devices not a multiple of tp", "devices = 2", "devices = 3\n", "models.policy.resources.devices",
     "3"),
    ("bad size", 'device_bytes = "1MiB"', 'device_bytes = "lots"',
     "models.policy.resources.device_bytes", "lots"),
    ("entry field outside [entry]", '[entry]\ncommand', 'command', "command", "sleep"),
    ("reserved env", "priority = 2", "priority = 2\n[env]\nPLEXRL_JOB = \"x\"", "env.PLEXRL_JOB", "x"),
    ("no rollout lane", "priority = 2", "priority = 2\nrollout_lanes = 0", "rollout_lanes", "0"),
    ("unknown rollout split", "priority = 2", 'priority = 2\nrollout_split = "tokens"',
     "rollout_split", "tokens"),
]


@pytest.mark.parametrize("why, old, new, field, value", BAD, ids=[b[0] for b in BAD])
def test_malformed_fields_name_file_field_value_and_fix(tmp_path, why, old, new, field, value):
    text = GOOD.replace(old, new)
    if why == "devices not a multiple of tp":
        text = text.replace('source = "tiny-qwen2"', 'source = "tiny-qwen2"\ntp = 2')
    assert text != GOOD
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_job_file(path).submission()
    err = info.value
    assert err.file == str(path) and err.field == field, why
    assert value in str(err.value) and err.fix, why
    assert str(path) in str(err) and field in str(err) and "fix:" in str(err)


def test_an_entry_point_written_at_the_top_says_it_belongs_in_the_entry_table(tmp_path):
    path = tmp_path / "top.toml"
    path.write_text(GOOD.replace('[entry]\ncommand = ["sleep", "1"]\n', "").replace(
        'name = "j1"', 'name = "j1"\nfile = "job.py"'))
    with pytest.raises(ConfigError) as info:
        load_job_file(path)
    assert info.value.field == "file" and "[entry]" in str(info.value)


def test_yaml_syntax_error_and_unknown_suffix_name_the_file(tmp_path):
    bad = tmp_path / "j.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="cannot parse") as info:
        load_job_file(bad)
    assert info.value.file == str(bad)
    other = tmp_path / "j.json"
    other.write_text("{}")
    with pytest.raises(ConfigError, match="TOML or YAML"):
        load_job_file(other)


def test_sizes():
    assert parse_bytes(5) == 5 and parse_bytes("64MiB") == 64 << 20
    assert parse_bytes("1.5 GB") == 1_500_000_000
    assert parse_bytes("x") is None and parse_bytes(True) is None
