"""The demo's progress display and remote verifier, without a runtime: the non-TTY lines
(every N steps of a phase, and the last), the in-place TTY redraw, and the verifier's wait."""

from __future__ import annotations

import io

import pytest

from plexrl.demo import verifier as verifier_mod
from plexrl.demo.progress import Progress
from plexrl.errors import ConfigError


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_non_tty_prints_a_status_line_every_n_steps_and_at_the_phase_end():
    out, clock = io.StringIO(), Clock()
    progress = Progress(out, ["copy", "reverse"], every=4, clock=clock)
    assert not progress.live                    # StringIO is not a terminal
    progress.phase("copy", "warm-up", 5)
    for step in range(1, 6):
        clock.now += 1.0
        progress.step("copy", step)
    progress.phase("copy", "GRPO", 8)
    for step in range(1, 9):
        clock.now += 0.5
        progress.step("copy", step, reward=step / 10)
    progress.say("reverse", "after warm-up: greedy accuracy 0.300")
    lines = out.getvalue().splitlines()
    assert [ln.split()[:4] for ln in lines[:4]] == [
        ["copy", "warm-up", "step", "4/5"], ["copy", "warm-up", "step", "5/5"],
        ["copy", "GRPO", "step", "4/8"], ["copy", "GRPO", "step", "8/8"]]
    assert "reward 0.800" in lines[3] and lines[3].endswith("9.0 s")     # 5 + 8 x 0.5
    assert "\x1b" not in out.getvalue()
    assert lines[4].endswith("reverse after warm-up: greedy accuracy 0.300")
    assert len(lines) == 5


def test_tty_rewrites_one_line_per_job_in_place():
    out, clock = io.StringIO(), Clock()
    progress = Progress(out, ["copy", "reverse"], live=True, refresh_s=0.0, clock=clock)
    progress.phase("copy", "GRPO", 10)
    progress.step("copy", 3, reward=0.5)
    progress.say("copy", "an event")
    clock.now += 2.0
    progress.phase("copy", "done")
    clock.now += 5.0
    progress.close()
    text = out.getvalue()
    assert "\x1b[2F" in text                 # cursor up over the 2 status lines
    assert text.count("an event") == 1
    last = text.rsplit("\x1b[2F", 1)[1]
    assert "copy    done" in last and "reward 0.500" in last and "2.0 s" in last


def test_the_remote_verifier_waits_its_latency_then_scores_unchanged(monkeypatch):
    slept = []
    monkeypatch.setattr(verifier_mod.time, "sleep", slept.append)

    def exact(completions, answer, **_):
        return [float(c == a) for c, a in zip(completions, answer)]
    wrapped = verifier_mod.remote_verifier(exact, 0.25)
    assert wrapped(prompts=["1="] * 2, completions=["1", "2"], answer=["1", "1"]) == [1.0, 0.0]
    assert slept == [0.25] and wrapped.__name__ == "exact"
    with pytest.raises(ConfigError):
        verifier_mod.remote_verifier(exact, -1.0)
