"""Benchmark: 3 RL jobs whose rollouts share 2 rollout worker groups, against the same jobs
each with a rollout group of its own (docs/design.md, D206).

Each job is a driver thread running GRPO-like steps through the client only: GENERATE with a
long-tailed length (``max_tokens`` drawn per job and step from a lognormal, the tail the
paper's rollouts have), a driver-side wait for the verifier (``--reward-s``), then LOGPROBS,
FORWARD_BACKWARD, OPTIM_STEP and SYNC_WEIGHTS. While a job scores and trains, its rollout
group has nothing of it to run: that is the idle share a shared rollout fleet fills.

Both modes run one training group (``purpose="train"``) that every job's trainer copy shares.

- private (the baseline, first): 3 rollout groups, one job's rollout copy on each
  (placement spreads them; the JSON lists where each job's GENERATEs ran).
- shared: 2 rollout groups; each job's rollout copy is 2 lanes, one on each group, and every
  GENERATE goes whole to one lane in turn (``rollout_split="calls"``; the other lane only
  keeps its sampling stream in step), so the 3 jobs' GENERATEs spread over both groups.
- shared-rows: the same groups and lanes, every GENERATE split by rows over both lanes.
  Both shared modes sample the tokens one copy samples (tests/runtime/test_rollout_lanes.py).

Both modes run the same jobs, seeds and lengths, and alternate over ``--rounds`` (a drift of
the machine falls on both alike). Held seconds = from the first timed call's start to the
last timed call's end (the controller's call log). Device-seconds per training step = the
devices of the run (4 private, 3 shared) x held seconds / timed steps of all jobs. Slowdown of
a job = its mean step time in a shared mode / private (driver wall time, waits included). A
tiny model's GENERATE takes about as long for 4 rows as for 8 (it is latency-bound), so
splitting by rows halves no call and doubles the devices a GENERATE holds. Also: each
group's busy share of the held window. The services do not pin cores (``device_cores``):
the emulated devices of both modes share the machine's cores, so a mode with more groups
computing at once is slowed by that too; ``cores`` in the JSON says how many there were.
Prints one JSON object; ``saving[mode]`` is 1 - mode / private device-seconds per step.
"""

from __future__ import annotations

import argparse, json, os, statistics, threading, time  # noqa: E401

import numpy as np

import plexrl
from plexrl.rl.grpo import build_batch
from plexrl.runtime.config import RuntimeConfig, WorkerGroupConfig
from plexrl.runtime.models import model_spec

JOBS = ("a", "b", "c")
PROMPTS = ([1, 5, 9], [1, 7], [2, 4, 6, 8], [3])
GROUP = 2                      # completions per prompt


def lengths(seed: int, steps: int, median: int, sigma: float, cap: int) -> list[int]:
    """Each step's GENERATE length: lognormal around ``median``, at most ``cap``."""
    rng = np.random.default_rng(seed)
    return [int(min(cap, max(1, round(median * np.exp(sigma * rng.standard_normal())))))
            for _ in range(steps)]


def train_step(job, step: int, max_tokens: int, reward_s: float) -> float:
    start = time.monotonic()
    prompts = [list(p) for p in PROMPTS for _ in range(GROUP)]
    gen = job.generate(prompts, step=step, max_tokens=max_tokens, temperature=1.0).result()
    rewards = np.array([np.mean(gen["tokens"][i, :n] < 32) for i, n in enumerate(gen["lengths"])])
    time.sleep(reward_s)                              # the verifier scores the completions
    rewards = rewards.reshape(len(PROMPTS), GROUP)
    advantages = (rewards - rewards.mean(1, keepdims=True)) / (rewards.std(1, keepdims=True) + 1e-6)
    batch = build_batch(prompts, gen, pad_id=0)   # old_logprobs replaced by LOGPROBS below
    old = job.logprobs(batch, step=step).result()["logprobs"]
    job.forward_backward({**batch, "old_logprobs": old,
                          "advantages": advantages.reshape(-1).astype(np.float32)},
                         loss="grpo", step=step).result()
    optim = job.optim_step(lr=1e-2, step=step)
    job.sync_weights(step=step).result()
    optim.result()
    return time.monotonic() - start


def config(rollout_groups: int) -> RuntimeConfig:
    groups = (WorkerGroupConfig("train", 1, "train"),
              *(WorkerGroupConfig(f"roll{i}", 1, "rollout") for i in range(rollout_groups)))
    return RuntimeConfig(worker_groups=groups)


def run_mode(mode: str, tag: str, plan: dict[str, list[int]], warmup: int, reward_s: float,
             source: str) -> dict:
    """One run: the 3 jobs together, warm-up steps, a barrier, then the timed steps."""
    rollout_groups, lanes = (3, 1) if mode == "private" else (2, 2)
    split = "rows" if mode == "shared-rows" else "calls"
    runtime = plexrl.connect(config=config(rollout_groups))
    try:
        spec = model_spec("policy", source=source)
        jobs = {n: runtime.register_job(f"{n}-{tag}", {"policy": spec}, seed=i + 1,
                                        rollout_lanes=lanes, rollout_split=split)
                for i, n in enumerate(JOBS)}
        barrier, step_s = threading.Barrier(len(JOBS)), {}

        def driver(name: str) -> None:
            job, plan_of = jobs[name], plan[name]
            for k in range(warmup):
                train_step(job, k, plan_of[k], reward_s)
            barrier.wait()
            step_s[name] = [train_step(job, k, plan_of[k], reward_s)
                            for k in range(warmup, len(plan_of))]
        threads = [threading.Thread(target=driver, args=(n,)) for n in JOBS]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        calls = [c for c in runtime.inspect("calls") if c["step"] >= warmup and not c["failed"]]
    finally:
        runtime.close()
    start, end = min(c["start_s"] for c in calls), max(c["end_s"] for c in calls)
    devices = 1 + rollout_groups
    busy = {}
    for c in calls:
        busy[c["wg"]] = busy.get(c["wg"], 0.0) + c["end_s"] - c["start_s"]
    rollout_on = {n: sorted({c["wg"] for c in calls if c["job"] == f"{n}-{tag}"
                             and c["function"] == "generate"}) for n in JOBS}
    return {"devices": devices, "held_s": end - start,
            "timed_steps": sum(len(v) for v in step_s.values()),
            "step_s": {n: statistics.mean(v) for n, v in step_s.items()},
            "busy_share": {wg: b / (end - start) for wg, b in sorted(busy.items())},
            "rollout_groups_of": rollout_on}


def measure(*, steps: int = 6, warmup: int = 1, rounds: int = 2, reward_s: float = 0.05,
            median: int = 12, sigma: float = 0.8, cap: int = 64,
            source: str = "tiny-qwen2") -> dict:
    plan = {n: lengths(7 + i, warmup + steps, median, sigma, cap) for i, n in enumerate(JOBS)}
    runs = {"private": [], "shared": [], "shared-rows": []}
    for r in range(rounds):
        for i, mode in enumerate(runs):
            runs[mode].append(run_mode(mode, f"m{i}r{r}", plan, warmup, reward_s, source))
    out = {}
    for mode, rows in runs.items():
        device_s = sum(x["devices"] * x["held_s"] for x in rows)
        out[mode] = {"devices": rows[0]["devices"],
                     "held_s": sum(x["held_s"] for x in rows),
                     "device_s_per_step": device_s / sum(x["timed_steps"] for x in rows),
                     "step_s": {n: statistics.mean(x["step_s"][n] for x in rows) for n in JOBS},
                     "busy_share": [x["busy_share"] for x in rows],
                     "rollout_groups_of": rows[0]["rollout_groups_of"]}
    private = out["private"]
    ratio = {m: out[m]["device_s_per_step"] / private["device_s_per_step"] for m in runs
             if m != "private"}
    return {"bench": "shared_rollout", "steps": steps, "warmup": warmup, "rounds": rounds,
            "reward_s": reward_s, "max_tokens": plan, "cores": os.cpu_count(), **out,
            "device_s_per_step_ratio": ratio, "saving": {m: 1 - r for m, r in ratio.items()},
            "slowdown": {m: {n: out[m]["step_s"][n] / private["step_s"][n] for n in JOBS}
                         for m in ratio}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="timed steps per job and round")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--reward-s", type=float, default=0.05)
    parser.add_argument("--median", type=int, default=12, help="median GENERATE length, tokens")
    parser.add_argument("--sigma", type=float, default=0.8, help="lognormal sigma of the length")
    parser.add_argument("--cap", type=int, default=64, help="longest GENERATE, tokens")
    args = parser.parse_args()
    report = measure(steps=args.steps, warmup=args.warmup, rounds=args.rounds,
                     reward_s=args.reward_s, median=args.median, sigma=args.sigma, cap=args.cap)
    print(json.dumps(report, indent=2, default=float))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
