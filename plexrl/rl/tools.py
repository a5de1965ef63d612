"""Tools a rollout calls: each call in a limited child process; failures are results.

Owns: ``ToolLimits`` (RLIMIT_AS, RLIMIT_CPU, RLIMIT_FSIZE, a wall timeout, output size),
``run_in_child`` (one call: a fresh ``python -I -S tool_child.py`` in its own session, so
its own process group; ``killpg`` with SIGKILL on the wall timeout and after every call, so
nothing it forked outlives it), the tools (``Calculator``: AST-walked arithmetic;
``PythonTool``: untrusted Python, run only inside the limited child), ``ToolBox`` (the call
syntax ``[...]`` parsed from model text, what the model sees back, concurrent calls) and
``ToolReport`` (counts per kind; the job goes on whatever a call did).

Kinds of result: ``ok``; ``error`` (the tool raised, or the call named no tool); ``memory``
(RLIMIT_AS refused an allocation); ``cpu`` (RLIMIT_CPU: SIGXCPU or the SIGKILL after it);
``timeout`` (the wall timeout: the process group was killed); ``killed`` (any other
signal); ``crashed`` (the child exited without a result line).
Must not know: the client, the model, tokenizers (the rollout encodes what ``render``
returns), torch, ray.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Protocol, Sequence

from plexrl.errors import ConfigError

CHILD = Path(__file__).with_name("tool_child.py")
POLL_S = 0.005               #: how often a waiting call checks on its child
KINDS = ("ok", "error", "memory", "cpu", "timeout", "killed", "crashed")


@dataclass(frozen=True)
class ToolLimits:
    """What one tool call may use. ``as_bytes`` bounds the child's address space (Python
    itself needs ~30 MiB of it), ``cpu_s`` its CPU seconds (whole seconds, >= 1), ``wall_s``
    its wall time before the process group is killed."""

    as_bytes: int = 256 * 2**20
    cpu_s: int = 2
    wall_s: float = 5.0
    fsize_bytes: int = 2**20     #: largest file the child may write
    max_chars: int = 32          #: result characters the model sees

    def __post_init__(self):
        if self.cpu_s < 1 or self.wall_s <= 0 or self.as_bytes < 64 * 2**20:
            raise ConfigError("tool limits out of range", field="tools.limits",
                              value=(self.as_bytes, self.cpu_s, self.wall_s),
                              fix="as_bytes >= 64 MiB, cpu_s >= 1, wall_s > 0")


@dataclass(frozen=True)
class ToolResult:
    """One tool call's outcome; ``text`` is the value (ok) or what went wrong."""

    tool: str
    kind: str                    #: one of KINDS
    text: str
    wall_s: float                #: seconds from spawn to reaped
    start_s: float = 0.0         #: time.monotonic() at spawn (a timeline places the call)


def run_in_child(mode: str, source: str, limits: ToolLimits, tool: str = "") -> ToolResult:
    """Evaluate ``source`` in a limited child (``mode`` "arith" or "python")."""
    nonce = secrets.token_hex(8)
    request = json.dumps({"mode": mode, "source": source, "nonce": nonce,
                          "limits": asdict(limits)}).encode()
    start = time.monotonic()
    with tempfile.TemporaryFile() as out:
        try:
            proc = subprocess.Popen([sys.executable, "-I", "-S", str(CHILD)],
                                    stdin=subprocess.PIPE, stdout=out, stderr=subprocess.DEVNULL,
                                    start_new_session=True, close_fds=True, env={})
        except OSError as err:       # no process to run it in (fork refused): still a result
            return ToolResult(tool, "crashed", f"not started: {err}",
                              time.monotonic() - start, start)
        try:
            proc.stdin.write(request)
            proc.stdin.close()
        except BrokenPipeError:      # it died before reading: its status says why
            pass
        code, cpu_s = _reap(proc, start + limits.wall_s)
        out.seek(0)
        text = out.read(limits.fsize_bytes).decode(errors="replace")
    wall_s = time.monotonic() - start
    kind, detail = _outcome(code, cpu_s, text, nonce, limits)
    return ToolResult(tool, kind, detail, wall_s, start)


def _reap(proc: subprocess.Popen, deadline: float) -> tuple[int | None, float]:
    """Wait for the child until ``deadline`` (monotonic), then kill its process group either
    way, while the unreaped child still holds the group id (strays it forked die too), and
    reap it. Returns (its exit code, None on the wall timeout; its CPU seconds)."""
    exited = False
    while not exited and time.monotonic() < deadline:
        exited = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
        if not exited:
            time.sleep(POLL_S)
    _kill_group(proc.pid)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)    # reaped here, not by Popen
    return (proc.returncode if exited else None), usage.ru_utime + usage.ru_stime


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _outcome(code: int | None, cpu_s: float, text: str, nonce: str,
             limits: ToolLimits) -> tuple[str, str]:
    if code is None:
        return "timeout", f"no result in {limits.wall_s:g} s"
    for line in reversed(text.splitlines()):
        if line.startswith(nonce):
            result = json.loads(line[len(nonce):])
            return result["kind"], result["text"]
    if code == -signal.SIGXCPU or (code == -signal.SIGKILL and cpu_s >= limits.cpu_s):
        return "cpu", f"over {limits.cpu_s} s of CPU (signal {-code})"
    if code < 0:
        return "killed", f"signal {-code}"
    return "crashed", f"exit status {code}"


class Tool(Protocol):
    """A tool: a name, and how one call's argument is evaluated (in a limited child)."""

    name: str

    def __call__(self, argument: str, limits: ToolLimits) -> ToolResult: ...


@dataclass(frozen=True)
class Calculator:
    """Arithmetic on number literals (+ - * / // % **, exponents <= 256), AST-walked."""

    name: str = "calc"

    def __call__(self, argument: str, limits: ToolLimits) -> ToolResult:
        return run_in_child("arith", argument, limits, self.name)


@dataclass(frozen=True)
class PythonTool:
    """Untrusted Python: an expression's value, or the ``result`` a block binds. With a
    ``prelude`` (run first, in the same child under the same limits) the argument must be
    an expression."""

    name: str = "py"
    prelude: str = ""

    def __call__(self, argument: str, limits: ToolLimits) -> ToolResult:
        source = f"{self.prelude}\nresult = ({argument})" if self.prelude else argument
        return run_in_child("python", source, limits, self.name)


@dataclass
class ToolReport:
    """Counts of tool results per kind, and their wall seconds; safe across threads."""

    counts: Counter = field(default_factory=Counter)
    wall_s: float = 0.0
    max_wall_s: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, result: ToolResult) -> None:
        with self._lock:
            self.counts[result.kind] += 1
            self.wall_s += result.wall_s
            self.max_wall_s = max(self.max_wall_s, result.wall_s)

    @property
    def num_calls(self) -> int:
        return sum(self.counts.values())

    def summary(self) -> dict[str, int]:
        return {kind: self.counts[kind] for kind in KINDS if self.counts[kind]}


class ToolBox:
    """The tool call syntax and its tools.

    A call is ``open + [name ":"] argument + close`` at the end of a model's turn (``[3*4]``
    or ``[py:sum(range(5))]``); without a known ``name:`` prefix the ``default`` tool gets
    the whole argument. What the model sees back is ``result_open + text + result_close``:
    the value when ok, else the kind (``{timeout}``), so the vocabulary stays small.
    """

    def __init__(self, tools: Sequence[Tool] = (Calculator(),), *, default: str | None = None,
                 limits: ToolLimits = ToolLimits(), open: str = "[", close: str = "]",
                 result_open: str = "{", result_close: str = "}", max_parallel: int = 2):
        self.tools = {t.name: t for t in tools}
        self.default = default or tools[0].name
        self.limits, self.open, self.close = limits, open, close
        self.result_open, self.result_close = result_open, result_close
        self.max_parallel = max_parallel
        self.report = ToolReport()

    def parse(self, text: str) -> str | None:
        """The call that ends ``text`` (the part between the last open and the close)."""
        if not text.endswith(self.close) or self.open not in text:
            return None
        return text[text.rindex(self.open) + len(self.open):-len(self.close)]

    def call(self, call: str) -> ToolResult:
        """Run one parsed call; the result is counted in ``report``."""
        name, sep, argument = call.partition(":")
        tool = self.tools.get(name) if sep else None
        tool, argument = (tool, argument) if tool else (self.tools[self.default], call)
        result = tool(argument, self.limits)
        self.report.add(result)
        return result

    def call_many(self, calls: Sequence[str]) -> list[ToolResult]:
        """Run ``calls`` at most ``max_parallel`` at a time; results in order."""
        if len(calls) <= 1 or self.max_parallel <= 1:
            return [self.call(c) for c in calls]
        with ThreadPoolExecutor(max_workers=min(self.max_parallel, len(calls))) as pool:
            return list(pool.map(self.call, calls))

    def render(self, result: ToolResult) -> str:
        """The text appended to the model's context after the call."""
        text = result.text if result.kind == "ok" else result.kind
        return f"{self.result_open}{text[:self.limits.max_chars]}{self.result_close}"
