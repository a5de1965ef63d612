"""The demo's live progress display: one status per job (phase, step, reward, seconds).

Owns: ``Progress``. On a terminal (``live``) it keeps one line per job at the bottom of the
output and rewrites them in place with ANSI cursor moves (at most ``refresh_s`` apart), while
events (``say``) scroll above them; otherwise it prints a job's status line every ``every``
steps of a phase and at the phase's last step, plus the events. Phases: ``warm-up``, ``GRPO``,
``eval``, then ``done`` (the job's seconds stop). Thread-safe: the drivers of a shared run report from their own threads.
Must not know: the runtime, the client, how a job trains.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import dataclass

CLEAR_LINE = "\x1b[2K"


def _up(lines: int) -> str:
    """Move the cursor to the start of the line ``lines`` above."""
    return f"\x1b[{lines}F" if lines else "\r"


@dataclass
class Status:
    phase: str = "waiting"
    step: int = 0
    total: int = 0
    reward: float | None = None
    started_s: float | None = None      #: monotonic time of the job's start
    ended_s: float | None = None        #: and of its end (phase "done")

    def line(self, name: str, now: float, width: int) -> str:
        end = now if self.ended_s is None else self.ended_s
        seconds = 0.0 if self.started_s is None else end - self.started_s
        steps = f"step {self.step:>4}/{self.total:<4}" if self.total else " " * 14
        reward = f"reward {self.reward:.3f}" if self.reward is not None else " " * 12
        return f"{name:<{width}} {self.phase:<8} {steps} {reward} {seconds:6.1f} s"


class Progress:
    """Status lines of ``jobs`` (their names) written to ``out``."""

    def __init__(self, out=sys.stdout, jobs=(), *, every: int = 25, live: bool | None = None,
                 refresh_s: float = 0.1, clock=time.monotonic):
        self.out, self.every, self.refresh_s, self.clock = out, every, refresh_s, clock
        isatty = getattr(out, "isatty", None)
        self.live = bool(isatty and isatty()) if live is None else live
        self.start = clock()
        self.lock = threading.Lock()
        self.status: dict[str, Status] = {name: Status() for name in jobs}
        self.width = max((len(n) for n in self.status), default=10)
        self._drawn = 0            #: status lines now on screen (live)
        self._last_draw = -1e9

    def _status(self, job: str) -> Status:
        if job not in self.status:
            self.status[job] = Status()
            self.width = max(self.width, len(job))
        return self.status[job]

    def phase(self, job: str, phase: str, total: int = 0) -> None:
        """``job`` enters ``phase`` of ``total`` steps (0: no steps, e.g. an evaluation)."""
        with self.lock:
            status = self._status(job)
            if status.started_s is None:
                status.started_s = self.clock()
            status.phase, status.step, status.total = phase, 0, total
            if phase == "done":
                status.ended_s = self.clock()
            self._draw(force=True)

    def step(self, job: str, step: int, reward: float | None = None) -> None:
        """``job`` finished step ``step`` (1-based) of its phase; ``reward`` if it has one."""
        with self.lock:
            status = self._status(job)
            status.step = step
            if reward is not None:
                status.reward = reward
            if self.live:
                self._draw()
            elif step % self.every == 0 or step == status.total:
                self._print(status.line(job, self.clock(), self.width))

    def say(self, job: str, text: str) -> None:
        """An event of ``job``: one line that stays in the output."""
        with self.lock:
            line = f"[{self.clock() - self.start:6.1f}s] {job:<{self.width}} {text}"
            if self.live:
                self._clear()
                self._print(line)
                self._draw(force=True)
            else:
                self._print(line)

    def close(self) -> None:
        """Leave the last status lines on screen (live) and stop drawing."""
        with self.lock:
            if self.live:
                self._draw(force=True)
                self._drawn = 0
                self.live = False

    # -- terminal drawing (under the lock) ------------------------------------------------

    def _print(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def _clear(self) -> None:
        if self._drawn:
            self.out.write(_up(self._drawn) + "".join(CLEAR_LINE + "\n"
                                                      for _ in range(self._drawn))
                           + _up(self._drawn))
            self._drawn = 0

    def _draw(self, force: bool = False) -> None:
        if not self.live:
            return
        now = self.clock()
        if not force and now - self._last_draw < self.refresh_s:
            return
        self._last_draw = now
        lines = [s.line(n, now, self.width) for n, s in self.status.items()]
        self.out.write((_up(self._drawn) if self._drawn else "")
                       + "".join(CLEAR_LINE + line + "\n" for line in lines))
        self.out.flush()
        self._drawn = len(lines)
