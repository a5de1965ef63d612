"""The sweep (``plexrl.sim.experiments.sweep``) and the ``--out`` artifacts (``plexrl.sim.experiments.artifacts``).

Runs on tests/data/tiny-sweep.toml: paper-e2e's 7B and 235B tables with small batches,
4 steps, and a 2 axes x 2 values x 2 seeds sweep, so the whole file takes seconds.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from plexrl.errors import ConfigError
from plexrl.sim.experiments import sweep as sweep_module
from plexrl.sim.experiments.artifacts import write_artifacts
from plexrl.sim.experiments.report import build_report
from plexrl.sim.scenario import load_scenario
from plexrl.sim.experiments.sweep import expand, render_sweep, run_sweep, variant

TINY = Path(__file__).resolve().parents[1] / "data" / "tiny-sweep.toml"
MODELS = ["Qwen2.5-7B-Instruct", "Qwen3-235B-A22B"]
METRICS = ["vs_split_async", "vs_colocated", "shared_vs_split_async", "shared_vs_colocated"]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def tiny():
    return load_scenario(str(TINY))


@pytest.fixture(scope="module")
def sweep(tiny):
    return run_sweep(tiny, 3)


# --- expansion and variants ---------------------------------------------------------------

def test_star_expands_to_every_key_of_the_table(tiny):
    assert expand(tiny, "workloads.*.length_sigma", 0.5) == [
        "workloads.math7b.length_sigma=0.5", "workloads.math235b.length_sigma=0.5"]
    assert expand(tiny, "models.*.mfu", 0.25) == ["models.qwen7b.mfu=0.25",
                                                  "models.qwen235b.mfu=0.25"]
    assert expand(tiny, "num_steps", 5.0) == ["num_steps=5"]


def test_whole_values_reach_int_fields(tiny):
    overrides = expand(tiny, "workloads.*.max_response_tokens", 2048.0)
    assert overrides == ["workloads.math7b.max_response_tokens=2048",
                         "workloads.math235b.max_response_tokens=2048"]
    s = variant(tiny, overrides)
    assert [w.max_response_tokens for w in s.workloads.values()] == [2048, 2048]


def test_variant_keeps_command_line_overrides_and_fixes_sizes(tiny):
    loaded = load_scenario(str(TINY), ("num_steps=5", "models.qwen7b.mfu=0.3"))
    s = variant(loaded, expand(loaded, "workloads.*.length_sigma", 1.1))
    assert (s.num_steps, s.models["qwen7b"].mfu, s.search_sizes) == (5, 0.3, False)
    assert {w.length_sigma for w in s.workloads.values()} == {1.1}
    assert s.source == loaded.source


def test_star_over_a_value_is_a_config_error(tiny):
    with pytest.raises(ConfigError):
        expand(tiny, "num_steps.*", 1.0)
    with pytest.raises(ConfigError):  # a variant is validated like a file
        variant(tiny, ["warmup_steps=4"])


# --- the sweep report ----------------------------------------------------------------------

def test_sweep_json_shape(sweep, tiny):
    assert set(sweep) == {"scenario", "seed", "seeds", "sweep", "negative", "sizes"}
    assert (sweep["scenario"], sweep["seed"], sweep["seeds"]) == ("tiny-sweep", 3, 2)
    assert list(sweep["sweep"]) == ["tail_sigma", "max_length"]
    for axis, entry in sweep["sweep"].items():
        assert entry["target"] == tiny.sweep.axes[axis].target
        assert entry["values"] == list(tiny.sweep.axes[axis].values)
        assert list(entry["savings"]) == MODELS  # first experiment per model; 7b-again skipped
        for model in MODELS:
            assert list(entry["savings"][model]) == METRICS
            for metric in METRICS:
                stats = entry["savings"][model][metric]
                assert len(stats["mean"]) == len(stats["min"]) == 2
                for mean, low in zip(stats["mean"], stats["min"]):
                    assert isinstance(mean, float) and -1 < low <= mean < 1
                    assert round(mean, 6) == mean and round(low, 6) == low


def test_every_workload_sees_the_axis_value(sweep):
    """math235b is the second workload: if '*' stood only for the first, its model's
    savings could not move with the value."""
    for axis, entry in sweep["sweep"].items():
        for model in MODELS:
            means = [tuple(entry["savings"][model][m]["mean"][i] for m in METRICS)
                     for i in range(len(entry["values"]))]
            assert means[0] != means[1], (axis, model)


def test_negative_lists_exactly_the_negative_means(sweep):
    expected = [{"axis": axis, "value": value, "model": model, "metric": metric,
                 "mean": entry["savings"][model][metric]["mean"][i]}
                for axis, entry in sweep["sweep"].items()
                for i, value in enumerate(entry["values"])
                for model in MODELS for metric in METRICS
                if entry["savings"][model][metric]["mean"][i] < 0]
    assert sweep["negative"] == expected
    assert all(n["mean"] < 0 for n in sweep["negative"])


def test_sweep_assembles_means_mins_and_negatives_in_order(tiny, monkeypatch):
    """With a fake run_point whose savings encode (variant, seed), every cell is known."""
    def fake(s, seed, sizes=None):
        sigma = s.workloads["math235b"].length_sigma
        tokens = s.workloads["math235b"].max_response_tokens
        base = sigma - 1 + tokens / 1e5 + seed / 100
        return {m: {"vs_split_async": base + k, "vs_colocated": None if k else -base,
                    "shared_vs_split_async": None, "shared_vs_colocated": None}
                for k, m in enumerate(MODELS)}

    monkeypatch.setattr(sweep_module, "run_point", fake)
    report = run_sweep(tiny, 3, max_workers=1)
    tail = report["sweep"]["tail_sigma"]["savings"]
    # sigma 0.5: base = -0.5 + 0.16384 + (0.03, 0.04); sigma 1.2: 0.2 + 0.16384 + (...)
    assert tail[MODELS[0]]["vs_split_async"] == {"mean": [-0.30116, 0.39884],
                                                 "min": [-0.30616, 0.39384]}
    assert tail[MODELS[0]]["vs_colocated"] == {"mean": [0.30116, -0.39884],
                                               "min": [0.29616, -0.40384]}
    assert tail[MODELS[1]]["vs_colocated"] == {"mean": [None, None], "min": [None, None]}
    assert [(n["axis"], n["value"], n["model"], n["metric"]) for n in report["negative"]] == [
        ("tail_sigma", 0.5, MODELS[0], "vs_split_async"),
        ("tail_sigma", 1.2, MODELS[0], "vs_colocated"),
        ("max_length", 2048.0, MODELS[0], "vs_split_async"),  # sigma 0.8: base < 0
        ("max_length", 8192.0, MODELS[0], "vs_split_async")]


def test_sweep_is_deterministic_and_independent_of_workers(sweep, tiny):
    again = run_sweep(tiny, 3, max_workers=1)
    assert json.dumps(again, sort_keys=True) == json.dumps(sweep, sort_keys=True)
    other = run_sweep(tiny, 4, max_workers=1)  # the seed is an input: different seeds differ
    assert other["sweep"] != sweep["sweep"]


def test_render_sweep_names_every_axis_model_and_negative(sweep):
    text = render_sweep(sweep)
    for axis, entry in sweep["sweep"].items():
        assert axis in text and entry["target"] in text
    for model in MODELS:
        assert model in text
    assert ("negative mean savings:" in text) == bool(sweep["negative"])


# --- artifacts ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def e2e(tiny, tmp_path_factory):
    report, results = build_report(tiny, 0)
    out = tmp_path_factory.mktemp("e2e") / "nested" / "out"
    return report, write_artifacts(out, report, results, tiny, 0), out


def _is_png(path: Path) -> bool:
    data = path.read_bytes()
    return len(data) > len(PNG_SIGNATURE) and data.startswith(PNG_SIGNATURE)


def test_e2e_artifacts_are_written_in_order(e2e):
    report, paths, out = e2e
    assert [p.name for p in paths] == ["report.json", "gpu_hours_per_step.png", "savings.png",
                                       "timeline.json"]
    assert all(p.parent == out and p.is_file() for p in paths)
    assert paths[0].read_text() == json.dumps(report, sort_keys=True) + "\n"
    assert all(_is_png(p) for p in paths[1:3])


def test_timeline_has_worker_group_tracks_and_moves(e2e):
    trace = json.loads(e2e[1][3].read_text())
    events = trace["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    spans = [e for e in events if e["ph"] == "X"]
    calls = [e for e in spans if e["cat"] == "call"]
    moves = [e for e in spans if e["cat"] == "move"]
    call_tracks = {names[e["tid"]] for e in calls}
    assert len(call_tracks) >= 2 and "train-shared" in call_tracks
    shared = {e["args"]["job"] for e in calls if names[e["tid"]] == "train-shared"}
    assert shared == {"j0-math7b", "j1-math7b"}
    assert any(e["name"] == "j0-math7b generate k=0" for e in calls)
    for track in call_tracks:  # one call at a time per worker group, even in microseconds
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in calls if names[e["tid"]] == track)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    assert moves and all(names[e["tid"]].endswith(" moves") for e in moves)
    assert all({"reason", "num_bytes"} <= set(e["args"]) for e in moves)


def test_sweep_artifacts_one_figure_per_axis(sweep, tiny, tmp_path):
    paths = write_artifacts(tmp_path / "sweep", sweep, None, tiny, 3)
    assert [p.name for p in paths] == ["report.json", "sweep_tail_sigma.png",
                                       "sweep_max_length.png"]
    assert json.loads(paths[0].read_text()) == sweep
    assert all(_is_png(p) for p in paths[1:])


def test_cli_sweep_prints_the_report_it_writes(tmp_path):
    out = tmp_path / "cli"
    done = subprocess.run(
        [sys.executable, "-m", "plexrl.cli.main", "sim", str(TINY), "--sweep", "--format",
         "json", "--set", "sweep.seeds=1", "--out", str(out)],
        capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (out / "report.json").read_text().strip()
    assert json.loads(done.stdout)["seeds"] == 1
