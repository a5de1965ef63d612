"""Benchmark: four Tinker clients multiplexed on one worker group, against the same four run
one after another; and what the Tinker HTTP path adds to a call over PlexRL's own client.

The clients are ``examples/tinker_rl.py``'s ``train()`` on the unmodified ``tinker`` SDK, each
with its own API key and seed, against one controller with one worker group of one device.

- sequential (the baseline, first): the four clients one after another. Each holds the group
  from its first call's start to its last call's end (the controller's call log); between
  its calls (the SDK's round trips, scoring its samples) the group has nothing to run.
- multiplexed: the four at once; the held window is from the first call's start to the last
  call's end of all four.
Device-seconds per training step = 1 device x held seconds / (clients x steps); busy
seconds per step are the calls' own run time (``busy_share`` of the held window). The two
modes alternate over ``--rounds`` (a drift of the machine falls on both alike), and each
mode's runs must end with the same rewards and weights fingerprints as the other's (checked:
the bench fails if sharing changed a result).

Added latency per call: the same call through the SDK (HTTP, futures, long poll) and through
``JobClient`` (PlexRL's client) on the same runtime, alternating call by call after a
warm-up; the added time is the difference of the medians. Two calls: a sample (GENERATE of
``ANSWER`` tokens) and a forward (a LOGPROBS with the importance-sampling loss).
Prints one JSON object; ``saving`` is 1 - multiplexed / sequential device-seconds per step.
"""

from __future__ import annotations

import argparse, importlib.util, json, os, statistics, time  # noqa: E401
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tinker
from tinker import types

import plexrl
from plexrl.runtime.config import RuntimeConfig, WorkerGroupConfig
from plexrl.runtime.models import model_spec
from plexrl.runtime.tinker import batches, wire

os.environ.setdefault("TINKER_TELEMETRY", "0")
ROOT = Path(__file__).resolve().parents[1]
CLIENTS = 4


def _example():
    spec = importlib.util.spec_from_file_location("tinker_rl", ROOT / "examples" / "tinker_rl.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


EXAMPLE = _example()


def run_client(url: str, seed: int, tag: str, args) -> tuple[list[float], float]:
    service = tinker.ServiceClient(base_url=url, api_key=f"tml-{tag}-{seed}")
    try:
        return EXAMPLE.train(service, base_model=args.model, steps=args.steps,
                             prompts=args.prompts, group=args.group, seed=seed)
    finally:
        service.close("success")


def held_s(calls: list[dict]) -> float:
    return max(c["end_s"] for c in calls) - min(c["start_s"] for c in calls)


def run_mode(runtime, url: str, mode: str, tag: str, args) -> dict:
    before = len(runtime.inspect("calls"))
    start = time.monotonic()
    if mode == "sequential":
        results = [run_client(url, seed, tag, args) for seed in range(CLIENTS)]
    else:
        with ThreadPoolExecutor(CLIENTS) as pool:
            results = list(pool.map(lambda s: run_client(url, s, tag, args), range(CLIENTS)))
    wall = time.monotonic() - start
    calls = [c for c in runtime.inspect("calls")[before:] if not c["failed"]]
    by_job: dict[str, list[dict]] = {}
    for call in calls:
        by_job.setdefault(call["job"], []).append(call)
    held = sum(held_s(c) for c in by_job.values()) if mode == "sequential" else held_s(calls)
    busy = sum(c["end_s"] - c["start_s"] for c in calls)
    return {"held_s": held, "wall_s": wall, "busy_s": busy, "results": results,
            "steps": CLIENTS * args.steps}


def added_latency(runtime, url: str, args) -> dict:
    """Median seconds of each call through the SDK and through ``JobClient``, alternating."""
    service = tinker.ServiceClient(base_url=url, api_key="tml-latency")
    training = service.create_lora_training_client(base_model=args.model, rank=8).result()
    sampler = training.save_weights_and_get_sampling_client().result()
    job = runtime.register_job("native-latency", {"policy": model_spec("policy", args.model)})
    prompt = [EXAMPLE.BOS, EXAMPLE.FIRST]
    params = types.SamplingParams(max_tokens=EXAMPLE.ANSWER, temperature=1.0)
    probe = EXAMPLE.PROBE
    datum = wire.Datum(np.asarray(probe.model_input.to_ints(), np.int64),
                       {k: np.asarray(v.tolist()) for k, v in probe.loss_fn_inputs.items()})
    batch = batches.batch_of("importance_sampling", (datum,), 1 << 30)
    loss = batches.loss_args("importance_sampling", {})
    calls = {
        "sample": (lambda: sampler.sample(types.ModelInput.from_ints(prompt), 1, params).result(),
                   lambda: job.generate([prompt], step=0, max_tokens=EXAMPLE.ANSWER).result()),
        "forward": (lambda: training.forward([probe], "importance_sampling").result(),
                    lambda: job.logprobs(batch, loss="importance_sampling", **loss).result()),
    }
    out = {}
    for name, (http, native) in calls.items():
        times = {"http": [], "native": []}
        for i in range(args.warmup + args.calls):
            for path, call in (("http", http), ("native", native)):
                start = time.perf_counter()
                call()
                if i >= args.warmup:
                    times[path].append(time.perf_counter() - start)
        http_s, native_s = (statistics.median(times[p]) for p in ("http", "native"))
        out[name] = {"http_s": http_s, "native_s": native_s, "added_s": http_s - native_s,
                     "ratio": http_s / native_s}
    job.end()
    service.close("success")
    return out


def measure(args) -> dict:
    config = RuntimeConfig(worker_groups=(WorkerGroupConfig("wg0", 1),))
    runtime = plexrl.connect(config=config)
    try:
        url = runtime.inspect("endpoints")["tinker"]
        runs = {"sequential": [], "multiplexed": []}
        for r in range(args.rounds):
            for mode in runs:
                runs[mode].append(run_mode(runtime, url, mode, f"{mode[0]}{r}", args))
        latency = added_latency(runtime, url, args)
    finally:
        runtime.close()
    same = all(x["results"] == runs["sequential"][0]["results"]
               for rows in runs.values() for x in rows)
    if not same:
        raise SystemExit("a client's rewards or weights differ between the runs: sharing "
                         "changed a result")
    out = {}
    for mode, rows in runs.items():
        steps = sum(x["steps"] for x in rows)
        out[mode] = {"held_s": sum(x["held_s"] for x in rows),
                     "wall_s": sum(x["wall_s"] for x in rows),
                     "busy_share": sum(x["busy_s"] for x in rows) / sum(x["held_s"] for x in rows),
                     "busy_s_per_step": sum(x["busy_s"] for x in rows) / steps,
                     "device_s_per_step": sum(x["held_s"] for x in rows) / steps}
    ratio = out["multiplexed"]["device_s_per_step"] / out["sequential"]["device_s_per_step"]
    return {"bench": "tinker_multiplex", "clients": CLIENTS, "steps": args.steps,
            "rounds": args.rounds, "model": args.model, "cores": os.cpu_count(), **out,
            "same_results": same, "device_s_per_step_ratio": ratio, "saving": 1 - ratio,
            "final_rewards": [r[-1] for r, _ in runs["sequential"][0]["results"]],
            "added_latency": latency}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=5, help="training steps per client")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--calls", type=int, default=30, help="timed calls per path (latency)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--model", default="tiny-qwen2")
    print(json.dumps(measure(parser.parse_args()), indent=2, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
