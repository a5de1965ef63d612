"""One asyncio driver process of the load test (test_durable_load.py): registers its jobs with
a running controller (by name), runs GRPO-shaped steps on all of them at once for a bounded
time, each step's five calls issued together, then waits for every call's answer, ends its
jobs and prints one JSON object: every call id it issued and the answer each got.

Usage: python load_driver.py ADDRESS CONTROLLER PREFIX NUM_JOBS SECONDS
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from plexrl.client import Runtime
from plexrl.protocol import ModelSpec
from plexrl.runtime.transport import RayTransport

#: a model the simulated engine pretends to run (200 kB of States: 100 jobs swap through a group)
SPEC = ModelSpec(name="sim", total_params=1e4, active_params=1e4, num_layers=1, kv_heads=1,
                 head_dim=8, dtype_bytes=4, source="simulated", kv_cache_tokens=0,
                 vocab_size=64)
PROMPTS = [[1, 2, 3], [4, 5]]


async def _steps(job, until: float, answers: dict) -> None:
    k = 0
    while time.monotonic() < until:
        seq0 = job._seq
        futures = [job.generate(PROMPTS, step=k, max_tokens=4),
                   job.logprobs({"input_ids": [[1, 2, 3, 4]]}, step=k),
                   job.forward_backward({"input_ids": [[1, 2, 3, 4]]}, loss="grpo", step=k),
                   job.optim_step(lr=1e-3, step=k),
                   job.sync_weights(step=k)]
        for offset, future in enumerate(futures):
            key = f"{job.job}/{seq0 + offset}"
            try:
                await asyncio.wrap_future(future)
                answers[key] = answers.get(key, "") + "ok"
            except Exception as err:   # counted, reported
                answers[key] = answers.get(key, "") + type(err).__name__
        k += 1


async def main(address: str, controller: str, prefix: str, num_jobs: int, seconds: float):
    start = time.monotonic()
    runtime = Runtime(RayTransport(address, controller=controller))
    connected = time.monotonic()
    jobs = [runtime.register_job(f"{prefix}-{i}", {"policy": SPEC}, seed=i)
            for i in range(num_jobs)]
    answers: dict[str, str] = {}
    registered = time.monotonic()
    until = registered + seconds
    await asyncio.gather(*(_steps(job, until, answers) for job in jobs))
    drained = time.monotonic()
    issued = [f"{job.job}/{seq}" for job in jobs for seq in range(job._seq)]
    for job in jobs:
        job.end()
    runtime.close()
    seconds = {"connect": connected - start, "register": registered - connected,
               "calling": drained - registered, "end": time.monotonic() - drained}
    print(json.dumps({"issued": issued, "answers": answers, "seconds": seconds}), flush=True)


if __name__ == "__main__":
    address, controller, prefix, num_jobs, seconds = sys.argv[1:6]
    asyncio.run(main(address, controller, prefix, int(num_jobs), float(seconds)))
