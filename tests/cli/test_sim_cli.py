"""``plexrl sim`` as a user runs it: a subprocess, its exit code, stdout and stderr.

Bad input of every kind must end with exit code 2, one line on stderr
(``plexrl: error: <file>: <field>: ... (got <value>); fix: ...``), no traceback, nothing on
stdout and nothing written under ``--out``. Good input on tests/data/tiny-e2e.toml (a few
seconds a run) prints exactly one JSON object, the same bytes for the same seed whatever
the hash seed of the interpreter.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from plexrl.cli import main as cli_main

DATA = Path(__file__).resolve().parents[1] / "data"
TINY = DATA / "tiny-e2e.toml"
MODELS = ["Qwen2.5-7B-Instruct", "Qwen3-235B-A22B"]
MODES = ["colocated", "split-async", "plexrl", "plexrl-on-policy", "plexrl-shared",
         "plexrl-shared-on-policy"]
SAVINGS = {"vs_split_async", "vs_colocated", "ideal_vs_split_async", "ideal_vs_colocated",
           "vs_split_async_fixed"}
SHARED_SAVINGS = {"vs_split_async", "vs_colocated", "step_vs_split_async", "step_vs_colocated"}
FIGURES = {"gpu_hours_per_step", "step_s", "bubble_frac", "decode_efficiency", "slowdown", "sizes"}
TIMEOUT_S = 300


def plexrl(*args: str, hash_seed: str = "0", cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    return subprocess.run([sys.executable, "-m", "plexrl.cli.main", *args], capture_output=True,
                          text=True, timeout=TIMEOUT_S, env=env, cwd=cwd)


def tree(root: Path) -> dict[str, bytes | None]:
    """Every path under ``root`` with its bytes (None for a directory)."""
    return {str(p.relative_to(root)): (None if p.is_dir() else p.read_bytes())
            for p in sorted(root.rglob("*"))}


# --- bad input ------------------------------------------------------------------------------

def _missing(tmp: Path):
    path = tmp / "nope.toml"
    return [str(path)], [str(path), "no such scenario or file"]


def _directory(tmp: Path):
    path = tmp / "adir"
    path.mkdir()
    return [str(path)], [str(path), "directory"]


def _bad_toml(tmp: Path):
    path = tmp / "broken.toml"
    path.write_text('name = "x"\nnum_steps = = 4\n')
    return [str(path)], [str(path), "not valid TOML", "line 2", "'num_steps = = 4'"]


def _bad_json(tmp: Path):
    path = tmp / "broken.json"
    path.write_text('{"name": "x",\n "num_steps": }\n')
    return [str(path)], [str(path), "not valid JSON", "line 2", "\"num_steps\": }"]


def _override(*overrides: str):
    def case(tmp: Path):
        args = [str(TINY)]
        for text in overrides:
            args += ["--set", text]
        return args, [str(TINY)] + _EXPECT[overrides]
    return case


_EXPECT = {  # what the one line must name besides the file: the field and the value
    ("bogus=1",): ["bogus", "unknown key", "(got 1)"],
    ("models.qwen7b.tpp=2",): ["models.qwen7b.tpp", "unknown key", "(got 2)", "'tp'"],
    ('models.qwen7b.tp="two"',): ["models.qwen7b.tp", "integer", "(got 'two')"],
    ("cluster.device_memory_bytes=80GB",): ["cluster.device_memory_bytes", "(got '80GB')",
                                            "plain number"],
    ('modes=["turbo"]',): ["modes[0]", "(got 'turbo')", "'plexrl'"],
    ("queue_policy=lifo",): ["queue_policy", "(got 'lifo')", "'hrrs'"],
    ("sizes.qwen7b.train_gpus=-16",): ["sizes.qwen7b.train_gpus", "(got -16)", ">= 1"],
    # A model larger than every pool: preflight names the pool's sizes field and both sizes.
    ("cluster.device_memory_bytes=1e9",): ["sizes.qwen7b.", "Qwen2.5-7B-Instruct",
                                           "fits no worker group", re.compile(r"needs [\d.]+ GiB"),
                                           re.compile(r"has [\d.]+ GiB")],
    ("sizes.qwen235b.train_gpus=8",): ["sizes.qwen235b.train_gpus", "(got 8)", "Qwen3-235B-A22B",
                                       "8 devices"],
    ("noequals",): ["override has no '='", "(got 'noequals')"],
    ("modes=[]",): ["modes", "(got [])"],
    ("sizes.qwen7b.plexrl_private_choices=[3]",): ["sizes.qwen7b.plexrl_private_choices", "(got 3)"],
}


def _out_is_a_file(tmp: Path):
    path = tmp / "taken"
    path.write_text("not a directory\n")
    return [str(TINY), "--out", str(path)], [str(path), "--out", "directory"]


BAD = {
    "missing-file": _missing,
    "directory": _directory,
    "unparseable-toml": _bad_toml,
    "unparseable-json": _bad_json,
    "unknown-key-top": _override("bogus=1"),
    "unknown-key-nested": _override("models.qwen7b.tpp=2"),
    "wrong-type-int": _override('models.qwen7b.tp="two"'),
    "wrong-type-unit-suffix": _override("cluster.device_memory_bytes=80GB"),
    "unknown-mode": _override('modes=["turbo"]'),
    "unknown-queue-policy": _override("queue_policy=lifo"),
    "negative-size": _override("sizes.qwen7b.train_gpus=-16"),
    "model-fits-no-pool-memory": _override("cluster.device_memory_bytes=1e9"),
    "model-fits-no-pool-train": _override("sizes.qwen235b.train_gpus=8"),
    "malformed-set": _override("noequals"),
    "out-is-a-file": _out_is_a_file,
    "out-under-a-file": lambda tmp: _out_under_a_file(tmp),
    "negative-seed": lambda tmp: ([str(TINY), "--seed", "-1"], ["--seed", "(got -1)"]),
    "no-modes": _override("modes=[]"),
    "bad-size-choice": _override("sizes.qwen7b.plexrl_private_choices=[3]"),
}

def _out_under_a_file(tmp: Path):
    (tmp / "file").write_text("x\n")
    out = tmp / "file" / "sub"
    return [str(TINY), "--out", str(out)], [str(out), "--out"]


def _check_one_line_error(done: subprocess.CompletedProcess, expected: list, before: dict,
                          tmp: Path, out: Path) -> None:
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert done.stdout == "", done.stdout
    line = done.stderr.strip()
    assert line and "\n" not in line, f"stderr is not one line: {done.stderr!r}"
    assert line.startswith("plexrl: error: "), line
    assert "fix" in line.lower(), line
    for want in expected:
        if isinstance(want, re.Pattern):
            assert want.search(line), (want.pattern, line)
        else:
            assert want in line, (want, line)
    assert not out.exists(), "the --out directory was created"
    assert tree(tmp) == before, "something was written"


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_input_is_one_line_exit_2_and_writes_nothing(case, tmp_path):
    args, expected = BAD[case](tmp_path)
    out = tmp_path / "out"
    if "--out" not in args:
        args = [*args, "--out", str(out)]
    before = tree(tmp_path)
    done = plexrl("sim", *args, "--format", "json", cwd=tmp_path)
    _check_one_line_error(done, expected, before, tmp_path, out)


def test_error_check_itself_catches_a_traceback(tmp_path):
    """The checker must fail on what a bug looks like (a traceback, exit 1, stdout)."""
    fake = subprocess.CompletedProcess([], 1, stdout="{}", stderr="Traceback (most recent...)\n")
    with pytest.raises(AssertionError):
        _check_one_line_error(fake, [], tree(tmp_path), tmp_path, tmp_path / "out")


# --- good input -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Three runs of the tiny scenario at once: seed 0 under two hash seeds, and seed 1."""
    root = tmp_path_factory.mktemp("cli")
    specs = {"a": ("0", "0"), "b": ("12345", "0"), "other": ("0", "1")}
    procs = {}
    for name, (hash_seed, seed) in specs.items():
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        procs[name] = subprocess.Popen(
            [sys.executable, "-m", "plexrl.cli.main", "sim", str(TINY), "--format", "json",
             "--seed", seed, "--out", str(root / name)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    done = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=TIMEOUT_S)
        assert proc.returncode == 0, stderr
        done[name] = (stdout, stderr, root / name)
    return done


def test_json_is_one_object_with_savings_and_figures(runs):
    stdout, stderr, out = runs["a"]
    report = json.loads(stdout)  # the whole of stdout: one object, nothing else
    assert isinstance(report, dict)
    assert "Traceback" not in stderr
    assert (out / "report.json").read_text().strip() == stdout.strip()
    assert sorted(report["savings"]) == MODELS
    for model in MODELS:
        assert set(report["savings"][model]) >= SAVINGS
        for key in SAVINGS:
            assert isinstance(report["savings"][model][key], float), (model, key)
        for key in SHARED_SAVINGS:
            assert isinstance(report["savings"][model]["shared"][key], float), (model, key)
        assert sorted(report["models"][model]) == sorted(MODES)
        for mode in MODES:
            figures = report["models"][model][mode]
            assert set(figures) >= FIGURES, (model, mode)
            for name in FIGURES - {"sizes"}:
                assert isinstance(figures[name], float), (model, mode, name)
            assert figures["sizes"] and all(isinstance(v, int) and v > 0
                                            for v in figures["sizes"].values())


def test_same_seed_same_bytes_across_hash_seeds(runs):
    assert runs["a"][0] == runs["b"][0]


def test_different_seed_different_report(runs):
    assert runs["a"][0] != runs["other"][0]
    assert json.loads(runs["other"][0])["seed"] == 1


def _console_script() -> list[str]:
    script = Path(sys.executable).with_name("plexrl")
    return [str(script)] if script.exists() else [sys.executable, "-m", "plexrl.cli.main"]


@pytest.mark.parametrize("args", [["--help"], ["sim", "--help"]], ids=["plexrl", "plexrl-sim"])
def test_help_exits_0(args):
    done = subprocess.run([*_console_script(), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "usage: plexrl" in done.stdout
    if args[0] == "sim":
        assert "--format" in done.stdout and "--set" in done.stdout


def test_cli_sets_offline_environment(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("RAY_USAGE_STATS_ENABLED", raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    assert cli_main.main(["sim", str(tmp_path / "missing.toml")]) == 2
    assert os.environ["RAY_USAGE_STATS_ENABLED"] == "0"
    assert os.environ["HF_HUB_OFFLINE"] == "1"
    assert capsys.readouterr().err.startswith("plexrl: error: ")
