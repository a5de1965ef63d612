"""Four Tinker clients at once on one worker group, each learning as it does alone.

The clients are ``examples/tinker_rl.py``'s ``train()`` on the unmodified SDK, each with its
own API key and seed. Run one after another and then all at once against the same controller
(one worker group of one device), each returns the same rewards and the same fingerprint of
its final weights, bitwise: sharing the group changed nothing of any job's results. The
call log shows the four jobs' calls interleaved on that one group.
"""

from __future__ import annotations

import importlib.util
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import tinker

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("TINKER_TELEMETRY", "0")
SEEDS = (0, 1, 2, 3)


def _example():
    spec = importlib.util.spec_from_file_location("tinker_rl", ROOT / "examples" / "tinker_rl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_four_clients_at_once_each_learn_as_alone(connect):
    runtime = connect()
    url, train = runtime.inspect("endpoints")["tinker"], _example().train

    def run(seed: int):
        service = tinker.ServiceClient(base_url=url, api_key=f"tml-tenant-{seed}")
        try:
            return train(service, steps=3, prompts=4, group=4, seed=seed)
        finally:
            service.close("success")

    alone = [run(seed) for seed in SEEDS]
    before = len(runtime.inspect("calls"))
    with ThreadPoolExecutor(len(SEEDS)) as pool:
        together = list(pool.map(run, SEEDS))
    assert together == alone                                 # rewards and weights, bitwise
    assert len({fingerprint for _, fingerprint in alone}) == len(SEEDS)   # four distinct runs
    calls = sorted(runtime.inspect("calls")[before:], key=lambda c: c["start_s"])
    assert {c["wg"] for c in calls} == {"wg0"}
    assert len({c["job"] for c in calls}) == len(SEEDS)
    switches = sum(a["job"] != b["job"] for a, b in zip(calls, calls[1:]))
    assert switches > 3 * len(SEEDS), switches              # time-sliced, not one after another
