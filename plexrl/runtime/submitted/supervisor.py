"""A submitted job's program as a child process of the controller.

Owns: starting the entry point in its own process group (a new session) with its stdout and
stderr in one per-job log file, waiting for it, and ending it: SIGTERM to the whole group,
SIGKILL after a grace period, so helpers it started go too. It records the exit status
(negative: killed by that signal). Must not know: Ray, jobs' models, scheduling, tokens.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

#: variables Ray sets in its worker processes; a child must not think it is a Ray worker
_RAY_WORKER_ENV = ("RAY_JOB_ID", "RAY_RAYLET_PID", "RAY_NODE_ID", "RAY_ADDRESS",
                   "RAY_WORKER_MODE", "RAY_CLIENT_MODE")


class ChildProcess:
    """One running entry point; ``wait`` gives its exit status, ``kill`` ends its group."""

    def __init__(self, proc: asyncio.subprocess.Process, log_path: Path):
        self.proc, self.log_path = proc, log_path
        self.started_at = time.time()
        self.pid = proc.pid

    @classmethod
    async def start(cls, argv: list[str], *, cwd: str, env: dict[str, str],
                    log_path: Path) -> "ChildProcess":
        """Start ``argv`` in ``cwd`` with ``env`` over this process's environment (minus
        Ray's worker variables); stdout and stderr append to ``log_path``."""
        log_path.parent.mkdir(parents=True, exist_ok=True)
        full = {k: v for k, v in os.environ.items() if k not in _RAY_WORKER_ENV}
        full.update(env)
        with open(log_path, "ab", buffering=0) as log:
            log.write(f"[plexrl] start {' '.join(argv)} (cwd {cwd})\n".encode())
            proc = await asyncio.create_subprocess_exec(
                *argv, cwd=cwd, env=full, stdin=asyncio.subprocess.DEVNULL, stdout=log,
                stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        return cls(proc, log_path)

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    async def wait(self, timeout: float | None = None) -> int | None:
        """The exit status, or None if it still runs after ``timeout`` seconds."""
        try:
            return await asyncio.wait_for(self.proc.wait(), timeout)
        except asyncio.TimeoutError:
            return None

    async def kill(self, grace_s: float = 5.0) -> int:
        """SIGTERM the process group, SIGKILL it after ``grace_s``; the exit status."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if self.proc.returncode is not None:
                break
            try:
                os.killpg(self.pid, sig)
            except ProcessLookupError:
                break
            if await self.wait(grace_s) is not None:
                break
        code = await self.proc.wait()
        try:   # stragglers of the group that outlived its leader
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        return code
