"""The child-process supervisor (plexrl/runtime/submitted/supervisor.py): output in the log, exit
status recorded, the whole process group ended on kill."""

from __future__ import annotations

import asyncio
import os
import re
import signal

from plexrl.runtime.submitted.supervisor import ChildProcess


def run(coro):
    return asyncio.run(coro)


def test_stdout_and_stderr_go_to_the_log_and_the_exit_status_is_kept(tmp_path):
    log = tmp_path / "logs" / "j.log"

    async def go():
        child = await ChildProcess.start(
            ["bash", "-c", "echo out; echo err >&2; echo $PLEXRL_JOB; exit 3"], cwd=str(tmp_path),
            env={"PLEXRL_JOB": "j"}, log_path=log)
        return await child.wait(30)
    assert run(go()) == 3
    text = log.read_text()
    assert "out\n" in text and "err\n" in text and "\nj\n" in text


def test_kill_ends_the_whole_process_group(tmp_path):
    log = tmp_path / "j.log"

    async def go():
        child = await ChildProcess.start(
            ["bash", "-c", "sleep 300 & echo gc=$!; wait"], cwd=str(tmp_path), env={},
            log_path=log)
        for _ in range(100):
            if re.search(r"gc=(\d+)", log.read_text()):
                break
            await asyncio.sleep(0.05)
        grandchild = int(re.search(r"gc=(\d+)", log.read_text()).group(1))
        assert await child.wait(0.2) is None          # still running
        code = await child.kill(grace_s=2.0)
        return code, grandchild
    code, grandchild = run(go())
    assert code == -signal.SIGTERM
    for _ in range(100):   # reaped by init; gone or a zombie at worst
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{grandchild}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        asyncio.run(asyncio.sleep(0.05))
    else:
        raise AssertionError(f"grandchild {grandchild} outlived the kill")
