"""A load test of the control plane: 100 jobs from 4 asyncio driver processes, on simulated
engines (``engine="simulated"``: the services hold no bytes and answer small arrays), calling
at once for a bounded time. Every call id has exactly one terminal record in the journal and
exactly one answer at its client, and no call ran twice.

The groups' devices hold a few jobs' States each, so States swap all the time. Prefetch is
off: with a hundred jobs on one node the core's prefetch planning dominates (it sums the host
bytes of every State per candidate; docs/design.md), and this test is about the
journal and the answers, not the planner's speed.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

import ray

DRIVERS = 4
JOBS_PER_DRIVER = 25
CALLING_S = 4.0


def test_a_hundred_jobs_from_four_drivers_every_call_has_one_terminal_record_and_one_answer(
        ray_session, tmp_path):
    from plexrl.client import Runtime
    from plexrl.runtime.config import RuntimeConfig, WorkerGroupConfig
    from plexrl.runtime.transport import RayTransport
    config = RuntimeConfig(engine="simulated", state_dir=str(tmp_path / "state"),
                           worker_groups=tuple(WorkerGroupConfig(f"wg{i}", 1) for i in range(4)),
                           device_bytes=1 << 20, sim_call_s=0.002, prefetch=False)
    runtime = Runtime(RayTransport(config=config))
    try:
        journal = runtime.transport.info["journal"]
        driver = Path(__file__).with_name("load_driver.py")
        address = ray.get_runtime_context().gcs_address
        import plexrl   # the drivers import this checkout's plexrl
        env = {**os.environ, "PYTHONPATH": str(Path(plexrl.__file__).parents[1])}
        children = [subprocess.Popen(
            [sys.executable, str(driver), address, runtime.transport.controller_name, f"d{d}",
             str(JOBS_PER_DRIVER), str(CALLING_S)], stdout=subprocess.PIPE, text=True, env=env)
            for d in range(DRIVERS)]
        reports = []
        for child in children:
            out, _ = child.communicate(timeout=400)
            assert child.returncode == 0
            reports.append(json.loads(out.strip().splitlines()[-1]))
        executions = runtime.inspect("executions")
    finally:
        runtime.close()
    issued = [call for report in reports for call in report["issued"]]
    answers = {call: a for report in reports for call, a in report["answers"].items()}
    jobs = {call.split("/")[0] for call in issued}
    assert len(jobs) == DRIVERS * JOBS_PER_DRIVER == 100
    assert len(issued) == len(set(issued))
    assert {call.split("/")[0] for call in issued if call.endswith("/4")} == jobs  # a step each
    assert set(answers) == set(issued) and set(answers.values()) == {"ok"}   # one answer each
    db = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
    calls = {f"{j}/{s}": status for j, s, status in db.execute("SELECT job, seq, status FROM calls")}
    terminal = Counter(f"{j}/{s}" for j, s in db.execute("SELECT job, seq FROM outcomes"))
    db.close()
    assert set(calls) == set(issued) and set(calls.values()) == {"done"}
    assert set(terminal) == set(issued) and set(terminal.values()) == {1}
    assert all(e["repeated"] == [] for e in executions.values())
    assert sum(e["total"] for e in executions.values()) == len(issued)
    print([r["seconds"] for r in reports])
    print(f"{len(jobs)} jobs, {DRIVERS} drivers, {len(issued)} calls in {CALLING_S:g} s of "
          f"calling; per group executed {[e['total'] for e in executions.values()]}")
