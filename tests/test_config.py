"""plexrl.config: files, overrides, building frozen dataclasses, and the errors users see."""

from __future__ import annotations

import dataclasses
import json
import pickle
from dataclasses import dataclass
from typing import Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from plexrl import config, config_docs
from plexrl.config import MISSING, option
from plexrl.errors import ConfigError, PlexError


@dataclass(frozen=True)
class Model:
    tp: int = option(1, unit="count", doc="tensor-parallel degree", min=1, max=8)
    memory_bytes: int = option(80_000_000_000, unit="bytes", min=0)
    dtype: Literal["bf16", "fp16", "fp32"] = "bf16"


@dataclass(frozen=True)
class Cluster:
    num_nodes: int = option(unit="count", doc="nodes in the cluster", min=1)
    link_bytes_per_s: float = option(25e9, unit="bytes/s", min=0)
    mig: bool = False
    name: str = "default"
    tiers: tuple[str, ...] = ("gpu", "host")
    share_frac: list[float] = option(default_factory=list, unit="frac", min=0, max=1)
    queue: str = option("fifo", choices=("fifo", "hrrs"))


@dataclass(frozen=True)
class Scenario:
    cluster: Cluster
    models: dict[str, Model] = option(default_factory=dict)
    seed: int | None = None
    horizon_s: float = option(60.0, unit="s", min=0)


GOOD = """
horizon_s = 30
[cluster]
num_nodes = 2
tiers = ["gpu"]
share_frac = [0.25, 0.75]
[models.qwen7b]
tp = 2
"""


def write(tmp_path, text: str, name: str = "scenario.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def assert_actionable(err: ConfigError, path, field: str, value) -> None:
    """The message names the file, the dotted field, the offending value and the fix."""
    text = str(err)
    assert str(path) in text and err.file == str(path)
    assert err.field == field and field in text
    if value is not None:
        assert err.value == value and repr(value) in text
    assert "fix" in text and err.fix


# ---------------------------------------------------------------------------- build


def test_good_file_builds_frozen_dataclasses(tmp_path):
    scenario = config.load(Scenario, write(tmp_path, GOOD))
    assert scenario.horizon_s == 30.0 and isinstance(scenario.horizon_s, float)
    assert scenario.cluster == Cluster(num_nodes=2, tiers=("gpu",), share_frac=[0.25, 0.75])
    assert scenario.models == {"qwen7b": Model(tp=2)}
    assert scenario.seed is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        scenario.horizon_s = 1.0


ERRORS = [  # (toml, dotted field, offending value, words in the message)
    ("horizn_s = 3\n[cluster]\nnum_nodes = 1", "horizn_s", 3, ["unknown key", "horizon_s"]),
    ("[cluster]\nnum_nodes = 1\n[models.qwen7b]\ntpp = 2", "models.qwen7b.tpp", 2,
     ["did you mean 'tp'", "valid keys: tp, memory_bytes, dtype"]),
    ("[cluster]\nmig = true", "cluster.num_nodes", None,
     ["missing required field", "add num_nodes = <int, count> under [cluster]"]),
    ("horizon_s = 1", "cluster", None, ["missing required field", "add a [cluster] table"]),
    ('[cluster]\nnum_nodes = 1\n[models.qwen7b]\ntp = "2"', "models.qwen7b.tp", "2",
     ["expected an integer (count)", "remove the quotes"]),
    ('[cluster]\nnum_nodes = 1\n[models.a]\nmemory_bytes = "80GB"', "models.a.memory_bytes",
     "80GB", ["expected an integer (bytes)", "give a plain number in bytes"]),
    ("[cluster]\nnum_nodes = 2.0", "cluster.num_nodes", 2.0, ["without a decimal point"]),
    ("[cluster]\nnum_nodes = true", "cluster.num_nodes", True, ["expected an integer"]),
    ("[cluster]\nnum_nodes = 1\nmig = 1", "cluster.mig", 1, ["expected true or false"]),
    ("[cluster]\nnum_nodes = 1\nlink_bytes_per_s = false", "cluster.link_bytes_per_s", False,
     ["expected a number (bytes/s)"]),
    ('horizon_s = "10s"\n[cluster]\nnum_nodes = 1', "horizon_s", "10s",
     ["give a plain number in s"]),
    ("horizon_s = nan\n[cluster]\nnum_nodes = 1", "horizon_s", None, ["nan"]),
    ("[cluster]\nnum_nodes = 1\nname = 3", "cluster.name", 3, ["expected a string", "quotes"]),
    ('[cluster]\nnum_nodes = 1\ntiers = "gpu"', "cluster.tiers", "gpu", ["expected an array"]),
    ('[cluster]\nnum_nodes = 1\ntiers = ["gpu", 3]', "cluster.tiers[1]", 3,
     ["expected a string"]),
    ("[cluster]\nnum_nodes = 1\nshare_frac = [0.5, 1.5]", "cluster.share_frac[1]", 1.5,
     ["above the maximum 1 frac", "<= 1 frac"]),
    ("[cluster]\nnum_nodes = 0", "cluster.num_nodes", 0, ["below the minimum 1 count", ">= 1"]),
    ("[cluster]\nnum_nodes = 1\n[models.a]\ntp = 16", "models.a.tp", 16, ["maximum 8"]),
    ('[cluster]\nnum_nodes = 1\nqueue = "lifo"', "cluster.queue", "lifo",
     ["not an allowed value", "'fifo', 'hrrs'"]),
    ('[cluster]\nnum_nodes = 1\n[models.a]\ndtype = "bf61"', "models.a.dtype", "bf61",
     ["did you mean 'bf16'", "'fp16'"]),
    ("cluster = 3", "cluster", 3, ["expected a table", "[cluster]"]),
    ("models = 3\n[cluster]\nnum_nodes = 1", "models", 3, ["[models.<name>]"]),
    ('seed = "x"\n[cluster]\nnum_nodes = 1', "seed", "x", ["expected an integer"]),
]


@pytest.mark.parametrize(("text", "field", "value", "words"), ERRORS,
                         ids=[case[1] + ":" + case[3][0] for case in ERRORS])
def test_each_error_names_file_field_value_and_fix(tmp_path, text, field, value, words):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        config.load(Scenario, path)
    assert_actionable(info.value, path, field, value)
    for word in words:
        assert word in str(info.value)


def test_brief_example_message_reads_as_promised():
    with pytest.raises(ConfigError) as info:
        config.build(Scenario, {"cluster": {"num_nodes": 1}, "models": {"qwen7b": {"tp": "x"}}},
                     file="s.toml")
    assert str(info.value).startswith("s.toml: models.qwen7b.tp: expected an integer (count)")


def test_json_null_is_reported_as_null():
    with pytest.raises(ConfigError, match="got null"):
        config.build(Cluster, {"num_nodes": None}, file="c.json")


def test_optional_accepts_null_and_values():
    assert config.build(Scenario, {"cluster": {"num_nodes": 1}, "seed": None}).seed is None
    assert config.build(Scenario, {"cluster": {"num_nodes": 1}, "seed": 7}).seed == 7


def test_post_init_value_error_becomes_config_error():
    with pytest.raises(ConfigError) as info:
        config.build(Ordered, {"lo_s": 2, "hi_s": 1}, file="o.toml", prefix="window")
    assert info.value.field == "window" and "lo_s <= hi_s" in str(info.value)


@dataclass(frozen=True)
class Ordered:
    lo_s: float = option(0.0, unit="s")
    hi_s: float = option(1.0, unit="s")

    def __post_init__(self):
        if self.lo_s > self.hi_s:
            raise ValueError(f"need lo_s <= hi_s, got {self.lo_s} > {self.hi_s}")


@dataclass(frozen=True)
class Pipeline:
    stages: Literal[1, 2, 4] = option(1, unit="count")


@pytest.mark.parametrize(("value", "words"), [
    (3, "expected one of 1, 2, 4 (got 3); fix: use one of: 1, 2, 4"),
    (True, "expected one of 1, 2, 4 (got True)"),
    ("2", "expected one of 1, 2, 4 (got '2')"),
])
def test_literal_choices_are_exact(value, words):
    with pytest.raises(ConfigError) as info:
        config.build(Pipeline, {"stages": value}, file="p.toml")
    assert words in str(info.value) and info.value.field == "stages"


def test_config_error_is_plex_and_value_error_and_pickles(tmp_path):
    path = write(tmp_path, '[cluster]\nnum_nodes = 1\n[models.a]\nmemory_bytes = "80GB"')
    with pytest.raises(ConfigError) as info:
        config.load(Scenario, path)
    err = info.value
    assert isinstance(err, PlexError) and isinstance(err, ValueError)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is ConfigError and str(back) == str(err)
    assert (back.file, back.field, back.value, back.fix) == (err.file, err.field, err.value,
                                                             err.fix)
    assert back.field == "models.a.memory_bytes"


# ---------------------------------------------------------------------------- files


def test_json_and_toml_give_the_same_object(tmp_path):
    data = {"horizon_s": 30, "cluster": {"num_nodes": 2, "tiers": ["gpu"], "mig": True},
            "models": {"qwen7b": {"tp": 2, "dtype": "fp16"}}}
    toml = ('horizon_s = 30\n[cluster]\nnum_nodes = 2\ntiers = ["gpu"]\nmig = true\n'
            '[models.qwen7b]\ntp = 2\ndtype = "fp16"\n')
    from_toml = config.load(Scenario, write(tmp_path, toml))
    from_json = config.load(Scenario, write(tmp_path, json.dumps(data), "scenario.json"))
    assert from_toml == from_json
    assert config.read_file(tmp_path / "scenario.toml") == data


FILE_ERRORS = [  # (file name, content or None for absent, words in the message)
    ("absent.toml", None, ["file not found"]),
    ("bad.toml", "[cluster]\nnum_nodes = \n", ["not valid TOML", "line 2, column", "fix"]),
    ("bad.toml", "[cluster\n", ["not valid TOML", "line 1", "'[cluster'"]),
    ("bad.json", '{"cluster": {"num_nodes": 1,}}', ["not valid JSON", "line 1, column"]),
    ("list.json", "[1, 2]", ["top level must be a table", "'list'"]),
    ("scenario.yaml", "cluster: {}", ["unknown config file type", "'.yaml'", ".toml"]),
]


@pytest.mark.parametrize(("name", "content", "words"), FILE_ERRORS,
                         ids=[case[2][0] for case in FILE_ERRORS])
def test_file_errors_name_the_file_and_the_fix(tmp_path, name, content, words):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(ConfigError) as info:
        config.read_file(path)
    assert info.value.file == str(path) and str(path) in str(info.value)
    assert "fix: " in str(info.value)
    for word in words:
        assert word in str(info.value)


def test_directory_and_non_utf8_files_are_config_errors(tmp_path):
    (tmp_path / "dir.toml").mkdir()
    (tmp_path / "latin1.toml").write_bytes(b'name = "caf\xe9"\n')
    for name in ("dir.toml", "latin1.toml"):
        with pytest.raises(ConfigError, match="fix: "):
            config.read_file(tmp_path / name)


# ---------------------------------------------------------------------------- overrides


@pytest.mark.parametrize(("text", "key", "value"), [
    ("a.b=3", "a.b", 3),
    ("a = 2.5", "a", 2.5),
    ("a=1e9", "a", 1e9),
    ("a=-4", "a", -4),
    ("a=true", "a", True),
    ("a=false", "a", False),
    ("a=hello", "a", "hello"),
    ("a=qwen-7b", "a", "qwen-7b"),
    ("a=80GB", "a", "80GB"),
    ('a="x y"', "a", "x y"),
    ("a='3'", "a", "3"),
    ("a=[1, 2]", "a", [1, 2]),
    ('a=["gpu", "host"]', "a", ["gpu", "host"]),
    ("a={tp=2}", "a", {"tp": 2}),
    ("a=x=y", "a", "x=y"),
    (" models . qwen7b . tp = 2 ", "models.qwen7b.tp", 2),
])
def test_parse_override(text, key, value):
    assert config.parse_override(text) == (key, value)
    assert type(config.parse_override(text)[1]) is type(value)


@pytest.mark.parametrize(("text", "words"), [
    ("cluster.num_nodes", ["no '='", "section.field=value"]),
    ("=3", ["empty key"]),
    ("a..b=3", ["empty key"]),
    ("a=", ["no value"]),
    ("a=[1, 2", ["not valid TOML", "close quotes and brackets"]),
    ('a="open', ["not valid TOML"]),
])
def test_malformed_override_says_how_to_fix(text, words):
    with pytest.raises(ConfigError) as info:
        config.apply_overrides({}, [text], file="s.toml")
    assert info.value.value == text and repr(text) in str(info.value)
    assert "s.toml" in str(info.value) and "fix: " in str(info.value)
    for word in words:
        assert word in str(info.value)


def test_overrides_create_and_replace_nested_keys():
    data = {"cluster": {"num_nodes": 1, "mig": False}, "models": {"a": {"tp": 1}}}
    out = config.apply_overrides(data, [
        "cluster.num_nodes=4", "cluster.name=lab", "models.a.tp=2",
        "models.b.dtype=fp16", "x.y.z=[1.5, 2]", "seed=7",
    ], file="s.toml")
    assert out == {"cluster": {"num_nodes": 4, "mig": False, "name": "lab"},
                   "models": {"a": {"tp": 2}, "b": {"dtype": "fp16"}},
                   "x": {"y": {"z": [1.5, 2]}}, "seed": 7}
    assert data == {"cluster": {"num_nodes": 1, "mig": False}, "models": {"a": {"tp": 1}}}


def test_override_through_a_value_is_an_error():
    with pytest.raises(ConfigError) as info:
        config.apply_overrides({"cluster": {"num_nodes": 1}}, ["cluster.num_nodes.x=2"],
                               file="s.toml")
    assert info.value.field == "cluster.num_nodes" and info.value.value == 1
    assert "not a table" in str(info.value) and "fix: " in str(info.value)


def test_a_single_string_is_not_a_list_of_overrides():
    with pytest.raises(TypeError):
        config.apply_overrides({}, "a=1", file="s.toml")


def test_load_lays_file_over_defaults_and_overrides_over_both(tmp_path):
    path = write(tmp_path, GOOD)
    defaults = {"horizon_s": 5, "seed": 1, "cluster": {"mig": True, "num_nodes": 9}}
    scenario = config.load(Scenario, path, ["cluster.name=lab", "models.qwen7b.tp=4"],
                           defaults=defaults)
    assert (scenario.horizon_s, scenario.seed) == (30.0, 1)
    assert (scenario.cluster.num_nodes, scenario.cluster.mig) == (2, True)
    assert scenario.cluster.name == "lab" and scenario.models["qwen7b"].tp == 4
    assert defaults == {"horizon_s": 5, "seed": 1, "cluster": {"mig": True, "num_nodes": 9}}


def test_override_errors_name_the_file(tmp_path):
    path = write(tmp_path, GOOD)
    with pytest.raises(ConfigError) as info:
        config.load(Scenario, path, ["models.qwen7b.memory_bytes=80GB"])
    assert_actionable(info.value, path, "models.qwen7b.memory_bytes", "80GB")


# ---------------------------------------------------------------------------- option, describe


def test_option_carries_metadata():
    (f,) = [f for f in dataclasses.fields(Model) if f.name == "tp"]
    assert f.default == 1
    assert dict(f.metadata) == {"unit": "count", "doc": "tensor-parallel degree", "min": 1,
                                "max": 8, "choices": None}


def test_describe_lists_dotted_fields_with_types_units_defaults():
    rows = config_docs.describe(Scenario)
    assert ("cluster.num_nodes", "int", "count", MISSING) in rows
    assert ("cluster.tiers", "tuple[str, ...]", "", ("gpu", "host")) in rows
    assert ("cluster.share_frac", "list[float]", "frac", []) in rows
    assert ("models.<name>.tp", "int", "count", 1) in rows
    assert ("models.<name>.dtype", "Literal['bf16', 'fp16', 'fp32']", "", "bf16") in rows
    assert ("seed", "int | None", "", None) in rows
    assert ("horizon_s", "float", "s", 60.0) in rows
    assert len(rows) == len({row[0] for row in rows}) == 12


# ---------------------------------------------------------------------------- round trip


def to_plain(obj):
    """A dataclass as JSON-shaped data: tables for dataclasses, lists for tuples."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_plain(v) for v in obj]
    return obj


models = st.builds(Model, tp=st.integers(1, 8), memory_bytes=st.integers(0, 2**62),
                   dtype=st.sampled_from(["bf16", "fp16", "fp32"]))
clusters = st.builds(
    Cluster, num_nodes=st.integers(1, 10**6),
    link_bytes_per_s=st.floats(0, 1e15, allow_nan=False), mig=st.booleans(),
    name=st.text(), tiers=st.lists(st.text(max_size=5), max_size=4).map(tuple),
    share_frac=st.lists(st.floats(0, 1), max_size=4), queue=st.sampled_from(["fifo", "hrrs"]))
scenarios = st.builds(
    Scenario, cluster=clusters, models=st.dictionaries(st.text(min_size=1), models, max_size=3),
    seed=st.none() | st.integers(-(2**63), 2**63 - 1),
    horizon_s=st.floats(0, 1e9) | st.integers(0, 10**6).map(float))


@given(scenarios)
def test_build_round_trips_valid_values(scenario):
    assert config.build(Scenario, to_plain(scenario)) == scenario
    assert config.build(Scenario, dataclasses.asdict(scenario)) == scenario
    assert config.build(Scenario, json.loads(json.dumps(to_plain(scenario)))) == scenario


@pytest.mark.parametrize("field, value, words", [
    ("queue_policy", "lifo", "use one of: 'hrrs', 'fcfs', 'round-robin'"),
    ("threads", 0, "use a value >= 1"),
    ("pipeline_lead_s", -1.0, "use a value >= 0.0 s"),
])
def test_a_runtime_config_made_in_code_is_checked_like_a_file(field, value, words):
    """A bad option given in Python fails when the config is made, naming the field and the
    fix, not later inside the controller."""
    from plexrl.runtime.config import RuntimeConfig
    with pytest.raises(ConfigError) as info:
        RuntimeConfig(**{field: value})
    assert info.value.field == field and info.value.value == value and words in str(info.value)
