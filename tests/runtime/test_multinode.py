"""Runs the two-node test in its own pytest process (a local multi-node Ray cluster cannot
share a process with this session's cluster)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent


def test_two_worker_groups_on_two_nodes_in_their_own_process():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "--timeout", "240", str(HERE / "multinode" / "two_nodes_check.py")],
                          capture_output=True, text=True, env=env, timeout=280)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "1 passed" in done.stdout
