"""Benchmark: how much host work on the other cores changes an emulated device core's speed.

An emulated device computes on a CPU core of its own (``plexrl.runtime.workers.cores``, D181), but
the cores of one machine share caches, memory bandwidth and, on many virtual machines, one
physical core's execution units; a GPU shares none of these with the host. This bench times
the same device work on the reserved core with the other cores idle (the baseline), then
with each running a pure-Python loop (as drivers, the controller and Ray do), then with each
copying memory. Two kinds of device work: a 256x256 linear layer (``linear``) and a
tiny-qwen2 forward pass (``tiny-qwen2``, Python-bound like the tiny models' calls). The
conditions alternate over ``--rounds``, so a drift of the machine falls on all of them.
Prints one JSON object: per work, the median seconds of each condition and their ratios to
idle (``slowdown_host_python``, ``slowdown_host_memcpy``). The multiplexing bench reports
the effect on whole calls as ``compute_inflation`` (docs/design.md, D186).
"""

from __future__ import annotations

import argparse, json, multiprocessing, os, statistics, sys, threading, time  # noqa: E401

import numpy as np
import torch

from plexrl.runtime.workers.cores import pin_thread, reserve
from plexrl.runtime.models import build_module, model_spec

LOADS = ("python", "memcpy")
WORKS = {"linear": 3000, "tiny-qwen2": 100}   #: timed passes per measurement


def host_load(kind: str, stop) -> None:
    """Keep one host core busy until ``stop`` is set: a pure-Python loop, or memory copies."""
    src = np.ones(8 << 20 if kind == "memcpy" else 1)
    dst = np.empty_like(src)
    total = 0
    while not stop.is_set():
        if kind == "memcpy":
            np.copyto(dst, src)
        else:
            for i in range(100_000):
                total += i


def device_work(work: str, cores: tuple[int, ...]) -> float:
    """Seconds of ``WORKS[work]`` passes on ``cores`` (a thread pinned there, one torch
    thread), after two untimed passes."""
    out = {}

    def run() -> None:
        pin_thread(cores)
        torch.set_num_threads(1)
        torch.manual_seed(0)
        if work == "linear":
            module, inputs = torch.nn.Linear(256, 256), {"input": torch.randn(64, 256)}
        else:
            module = build_module(model_spec("policy", source=work), seed=0)
            inputs = {"input_ids": torch.randint(1, 64, (24, 30))}
        with torch.no_grad():
            for _ in range(2):
                module(**inputs)
            start = time.perf_counter()
            for _ in range(WORKS[work]):
                module(**inputs)
            out["s"] = time.perf_counter() - start
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return out["s"]


def under(kind: str | None, work: str, device: tuple[int, ...]) -> float:
    """``device_work`` while every host core runs ``host_load(kind)`` (None: they stay idle)."""
    if kind is None:
        return device_work(work, device)
    stop = multiprocessing.Event()
    loads = [multiprocessing.Process(target=host_load, args=(kind, stop))
             for _ in os.sched_getaffinity(0)]
    for p in loads:
        p.start()
    time.sleep(0.3)   # the loads are running
    try:
        return device_work(work, device)
    finally:
        stop.set()
        for p in loads:
            p.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    device = reserve(1)   # this process, and the loads it starts, keep off the device core
    if not device:
        print(json.dumps({"device_cores": [], "note": "one core: none to set aside for a device"}))
        return 0
    times = {(w, k): [] for w in WORKS for k in ("idle", *LOADS)}
    for _ in range(args.rounds):
        for work in WORKS:
            for kind in (None, *LOADS):
                times[(work, kind or "idle")].append(under(kind, work, device))
    median = {key: statistics.median(v) for key, v in times.items()}
    report = {work: {**{f"{k}_s": round(median[(work, k)], 4) for k in ("idle", *LOADS)},
                     **{f"slowdown_host_{k}": round(median[(work, k)] / median[(work, "idle")], 3)
                        for k in LOADS}}
              for work in WORKS}
    print(json.dumps({"device_cores": list(device), "host_cores": len(os.sched_getaffinity(0)),
                      "rounds": args.rounds, "passes": WORKS, **report}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
