"""Benchmark: 3 RL jobs multiplexed on one shared worker group, against each job alone.

Each job is a driver thread that runs GRPO-like steps through the client only (GENERATE,
then a driver-side wait -- ``reward_s`` for a verifier and, for some jobs, ``tool_s`` for a
tool stall -- then LOGPROBS, FORWARD_BACKWARD, OPTIM_STEP, SYNC_WEIGHTS). During the wait the
worker group has nothing of that job to run: that is the idle share multiplexing fills.

Both modes run on one runtime with one worker group of 1 emulated device, whose budget holds
the largest call's workspace and 1.5x the largest job's States: any one job fits beside any
call, two jobs' States never fit beside the largest, so in shared mode job switches move
bytes and that cost is inside the measurement (``--no-swap``: the default 256 MiB device).
The device computes on a CPU core of its own (``plexrl.runtime.workers.cores``, D181): the drivers,
the controller, state copies and Ray keep to the other cores, as host work does not run on
a GPU (a machine with a single core pins nothing; ``device_cores`` in the JSON says).

Isolated mode (the baseline, first): the jobs one after another, each alone on the group
(registered after the previous one ended). A job's ``--warmup`` steps calibrate it (first
half without waits, second half with the wait the first set): from their mean step time T0
and the group's busy time in them, the wait is set so that the idle share of an isolated
step is the job's target (``JOBS``).
The idle share is then measured on the timed steps: 1 - (seconds the group runs the job's
calls) / (seconds held). Outside 40-60% the bench prints its JSON and exits 1.

Shared mode: the same jobs (same seeds and waits) registered together; the 3 drivers warm
up, meet at a barrier, then run the same timed steps.

``--rounds R`` (default 4) splits the timed steps over R rounds of isolated-then-shared runs,
each calibrated afresh, so a drift of the machine's speed in the course of the bench falls on
both modes alike (later rounds register the jobs as ``<name>-r<round>``). Seconds and counts
are summed over the rounds, mean step times averaged.

Held seconds of a run = from the first timed call's start to the last timed call's end (the
controller's call log); ``device_s_per_step_wall`` uses the drivers' wall time instead.
Device-seconds per training step = devices x held seconds / timed training steps of all jobs
(isolated: the sum over the 3 runs). Slowdown of a job = its mean step time shared / alone
(driver wall time of whole steps, waits included). Also reported: ``slowdown_floor_est``,
the sum over jobs of (1 - idle share): if calls take as long as alone, no schedule on one
device keeps every job's slowdown below it; ``compute_inflation``, the seconds the service
computed the shared calls over those it computed the same calls alone (the host work on the
other cores slows the device's core, D186), and
``slowdown_floor_measured``, the floor with the calls as long as they were shared;
``shared_pace_spread``, the longest shared mean step over the shortest (1: the jobs kept one
pace); and ``slowdown_floor_one_pace``, the jobs' busy seconds per isolated step summed over
the shortest isolated step: jobs that keep one pace take at least their summed busy seconds
a step, so the job fastest alone is slowed at least that much (D188). Prints one
JSON object. Targets: >= 30% fewer device-seconds per step, every slowdown <= 1.25x.
"""

from __future__ import annotations

import argparse, json, statistics, sys, threading, time  # noqa: E401
from dataclasses import asdict, dataclass, replace

import numpy as np

import plexrl
from plexrl.core.jobs import ModelDecl, states_of
from plexrl.core.jobs import state_bytes as core_state_bytes
from plexrl.core.queues import QUEUES
from plexrl.protocol import CallRequest, Function, JobId, Role, State
from plexrl.runtime.config import RuntimeConfig, WorkerGroupConfig
from plexrl.runtime.workers.cores import reserve as reserve_cores
from plexrl.runtime.control.jobs import workspace_bytes
from plexrl.runtime.workers.order import copies_of
from plexrl.runtime.models import model_spec
from plexrl.runtime.transport import init_local

TARGET_SAVING_FRAC = 0.30
TARGET_SLOWDOWN = 1.25
IDLE_SHARE_RANGE = (0.40, 0.60)


@dataclass(frozen=True)
class JobPlan:
    """One job of the bench: its model, sampling sizes, and the idle share its wait makes."""

    name: str
    source: str                  #: built-in model config
    seed: int
    prompts: tuple[tuple[int, ...], ...]
    group: int                   #: completions per prompt
    max_tokens: int
    idle_share: float            #: target idle share of an isolated step, 0..1
    tool_frac: float = 0.0       #: part of the wait that is a tool stall (the rest: reward)
    reward_s: float = 0.0        #: set by calibration
    tool_s: float = 0.0          #: set by calibration

    @property
    def num_sequences(self) -> int:
        return len(self.prompts) * self.group


JOBS = (
    JobPlan("qwen-a", "tiny-qwen2", seed=1, prompts=((1, 5, 9), (1, 7), (1, 3, 4), (1, 2)),
            group=6, max_tokens=24, idle_share=0.55),
    JobPlan("qwen-b", "tiny-qwen2", seed=2, prompts=((1, 4), (1, 6, 8)), group=8, max_tokens=32,
            idle_share=0.55, tool_frac=0.5),
    JobPlan("llama-c", "tiny-llama", seed=3, prompts=((1, 9, 9), (1, 3), (1, 5, 2)), group=4,
            max_tokens=28, idle_share=0.55, tool_frac=0.3),
)


# -- one job's driver ---------------------------------------------------------------------------
def batch_of(prompts, gen: dict) -> dict[str, np.ndarray]:
    """Prompt + completion per row, right-padded; the loss sees only completion tokens."""
    rows = [list(p) + gen["tokens"][i, :gen["lengths"][i]].tolist() for i, p in enumerate(prompts)]
    ids = np.zeros((len(rows), max(map(len, rows))), dtype=np.int64)
    mask, loss_mask = np.zeros_like(ids), np.zeros(ids.shape, dtype=np.float32)
    for i, (prompt, row) in enumerate(zip(prompts, rows)):
        ids[i, :len(row)], mask[i, :len(row)], loss_mask[i, len(prompt):len(row)] = row, 1, 1
    return {"input_ids": ids, "attention_mask": mask, "loss_mask": loss_mask}


def train_step(job, plan: JobPlan, step: int, wait: bool) -> float:
    """One GRPO-like step; the driver waits (verifier, tool) between GENERATE and training.
    Returns its wall seconds."""
    start = time.monotonic()
    prompts = [list(p) for p in plan.prompts for _ in range(plan.group)]
    gen = job.generate(prompts, step=step, max_tokens=plan.max_tokens, temperature=1.0).result()
    rewards = np.array([np.mean(gen["tokens"][i, :n] < 32) for i, n in enumerate(gen["lengths"])])
    if wait:
        time.sleep(plan.reward_s)                     # the verifier scores the completions
        time.sleep(plan.tool_s)                       # a tool call stalls the episode
    rewards = rewards.reshape(len(plan.prompts), plan.group)
    advantages = (rewards - rewards.mean(1, keepdims=True)) / (rewards.std(1, keepdims=True) + 1e-6)
    batch = batch_of(prompts, gen)
    old = job.logprobs(batch, step=step).result()["logprobs"]
    job.forward_backward({**batch, "old_logprobs": old,
                          "advantages": advantages.reshape(-1).astype(np.float32)},
                         loss="grpo", step=step).result()
    optim = job.optim_step(lr=1e-2, step=step)    # with the sync, as plexrl.rl.grpo does
    job.sync_weights(step=step).result()
    optim.result()
    return time.monotonic() - start


def drive(job, plan: JobPlan, warmup: int, steps: int, barrier=None) -> list:
    """Warm-up steps, then (after the barrier, if any) the timed steps; their wall seconds."""
    for step in range(warmup):
        train_step(job, plan, step, wait=True)
    if barrier is not None:
        barrier.wait()
    return [train_step(job, plan, warmup + k, wait=True) for k in range(steps)]


def register(runtime, plan: JobPlan):
    return runtime.register_job(plan.name, {"policy": model_spec("policy", source=plan.source)},
                                seed=plan.seed)


# -- what the call log says ---------------------------------------------------------------------
def timed_calls(calls: list[dict], job: str, first_step: int) -> list[dict]:
    return [c for c in calls if c["job"] == job and c["step"] >= first_step and not c["failed"]]


def held(calls: list[dict]) -> tuple[float, float]:
    """(start, end) of the group's hold: first call's start to last call's end."""
    return min(c["start_s"] for c in calls), max(c["end_s"] for c in calls)


def busy_s(calls: list[dict]) -> float:
    """Seconds the group runs these calls, as the controller sees them (go to result)."""
    return sum(c["end_s"] - c["start_s"] for c in calls)


def compute_s(calls: list[dict]) -> float:
    """Seconds the service computed these calls (the part of ``busy_s`` inside the engine)."""
    return sum(c["duration_s"] for c in calls)


def queued_idle_s(calls: list[dict]) -> float:
    """Seconds the group ran none of these calls while one of them was queued: dispatch
    latency, plus, when jobs share the group, the switches (moves) it waited for."""
    ordered = sorted(calls, key=lambda c: c["start_s"])
    return sum(max(0.0, nxt["start_s"] - max(prev["end_s"], nxt["queued_s"]))
               for prev, nxt in zip(ordered, ordered[1:]))


def calibrate(plan: JobPlan, calls: list[dict], step_s: dict[int, float]) -> tuple[JobPlan, dict]:
    """Set the wait so that wait + gaps is ``idle_share`` of the step. From the steps in
    ``step_s`` (wall seconds less the wait they made), means (the idle share measured on the
    timed steps is one of sums): step T0, busy B, gaps G = T0 - B; wait = (f T0 - G) / (1 - f)."""
    t0 = statistics.mean(step_s.values())
    busy = statistics.mean(busy_s([c for c in calls if c["step"] == k]) for k in step_s)
    f = plan.idle_share
    wait = max(0.0, (f * t0 - (t0 - busy)) / (1 - f))
    tuned = replace(plan, reward_s=wait * (1 - plan.tool_frac), tool_s=wait * plan.tool_frac)
    return tuned, {"step_s": round(t0, 4), "busy_s": round(busy, 4), "gap_s": round(t0 - busy, 4)}


def warm_up(runtime, job, plan: JobPlan, warmup: int) -> tuple[JobPlan, dict]:
    """Calibrate in two stages: the first half of the warm-up runs without waits (the wait
    comes from its second half), the second half with that wait (it sets the wait again:
    a group that idles between calls may run them slower)."""
    half = max(1, warmup // 2)
    stages = [(range(half), range(half // 2, half)), (range(half, warmup), range(half, warmup))]
    calibration = {}
    for steps, measured in stages:
        if not steps:
            continue
        waited = plan.reward_s + plan.tool_s if steps.start else 0.0
        step_s = {k: train_step(job, plan, k, wait=bool(steps.start)) - waited for k in steps}
        calls = timed_calls(runtime.inspect("calls"), plan.name, 0)
        plan, calibration = calibrate(plan, calls, {k: step_s[k] for k in measured})
    return plan, calibration


def moves(transitions: list[dict], start: float, end: float) -> dict:
    inside = [t for t in transitions if start <= t["end_s"] <= end]
    return {"count": len(inside), "bytes": sum(t["num_bytes"] for t in inside),
            "seconds": round(sum(t["seconds"] for t in inside), 4),
            "count_all": len(transitions), "bytes_all": sum(t["num_bytes"] for t in transitions)}


# -- the two modes ------------------------------------------------------------------------------
def run_isolated(runtime, plan: JobPlan, warmup: int, steps: int) -> tuple[JobPlan, dict]:
    """One job alone on the runtime's one worker group: calibrate on the warm-up, then the
    timed steps; the job ends (its States released) before the next one registers."""
    job = register(runtime, plan)
    try:
        plan, calibration = warm_up(runtime, job, plan, warmup)
        step_s = [train_step(job, plan, warmup + k, wait=True) for k in range(steps)]
        calls = timed_calls(runtime.inspect("calls"), plan.name, warmup)
        transitions = [t for t in runtime.inspect("transitions") if t["job"] == plan.name]
    finally:
        job.end()
    start, end = held(calls)
    return plan, {"calibration": calibration, "mean_step_s": statistics.mean(step_s),
                  "wall_s": sum(step_s), "held_s": end - start, "busy_s": busy_s(calls),
                  "compute_s": compute_s(calls), "queued_idle_s": queued_idle_s(calls),
                  "idle_share": 1 - busy_s(calls) / (end - start),
                  "transitions": moves(transitions, start, end)}


def run_shared(runtime, plans: list[JobPlan], warmup: int, steps: int) -> dict:
    """The jobs together on the one worker group, one driver thread each. They register as
    ``shared-<name>`` (the isolated runs' calls stay in the same call log)."""
    plans = [replace(p, name=f"shared-{p.name}") for p in plans]
    barrier, step_s, errors = threading.Barrier(len(plans)), {}, []
    jobs = {plan.name: register(runtime, plan) for plan in plans}

    def driver(plan: JobPlan) -> None:
        try:
            step_s[plan.name] = drive(jobs[plan.name], plan, warmup, steps, barrier)
        except BaseException as err:  # noqa: BLE001 -- re-raised below, after the join
            errors.append(err)
            barrier.abort()
    threads = [threading.Thread(target=driver, args=(p,), name=p.name) for p in plans]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]
        calls = [c for p in plans for c in timed_calls(runtime.inspect("calls"), p.name, warmup)]
        transitions = [t for t in runtime.inspect("transitions") if t["job"] in jobs]
    finally:
        for job in jobs.values():
            job.end()
    start, end = held(calls)
    return {"jobs": {p.name.removeprefix("shared-"): {"mean_step_s": statistics.mean(step_s[p.name])}
                     for p in plans},
            "wall_s": max(sum(s) for s in step_s.values()),     # all start at the barrier
            "held_s": end - start, "busy_s": busy_s(calls), "compute_s": compute_s(calls),
            "queued_idle_s": queued_idle_s(calls), "transitions": moves(transitions, start, end)}


def group_config(device_bytes: int, cores: tuple[int, ...] = (),
                 queue_policy: str | None = None) -> RuntimeConfig:
    """One worker group of 1 emulated device of ``device_bytes``, computing on ``cores``,
    with the runtime's default queue policy unless one is named."""
    policy = {"queue_policy": queue_policy} if queue_policy else {}
    return RuntimeConfig(device_bytes=device_bytes, worker_groups=(WorkerGroupConfig("wg0", 1),),
                         device_cores=cores, **policy)


def one_group(device_bytes: int, cores: tuple[int, ...] = ()):
    """A runtime of one worker group of 1 emulated device, opened through the client."""
    return plexrl.connect(None, config=group_config(device_bytes, cores))


# -- the device budget --------------------------------------------------------------------------
def state_bytes(plan: JobPlan) -> int:
    """Bytes of all of a job's standing States (the policy's trainer and rollout copies), as
    the core counts them."""
    spec = model_spec("policy", source=plan.source)
    decl = ModelDecl(Role.POLICY, spec, copies_of(Role.POLICY, spec))
    return sum(core_state_bytes(decl, copy, state, 1, 0.0) for copy in decl.copies
               for state in states_of(decl, copy) if state != State.KV_CACHE)


def largest_workspace(plans) -> int:
    """The largest device reserve any call of these jobs makes (as the runtime sizes it)."""
    largest = 0
    for plan in plans:
        spec = model_spec("policy", source=plan.source)
        prompt = max(map(len, plan.prompts))
        for function in (Function.GENERATE, Function.LOGPROBS, Function.FORWARD_BACKWARD):
            length = prompt if function == Function.GENERATE else prompt + plan.max_tokens
            request = CallRequest(JobId(plan.name), "", 0, function, Role.POLICY,
                                  num_sequences=plan.num_sequences, seq_len=length,
                                  max_tokens=plan.max_tokens)
            largest = max(largest, workspace_bytes(spec, request))
    return largest


def device_budget(plans, swap: bool) -> dict:
    """``swap``: the largest call's workspace + 1.5x the largest job's States, so one job fits
    beside any call and two never do beside the largest; else the default device."""
    workspace, states = largest_workspace(plans), {p.name: state_bytes(p) for p in plans}
    budget = workspace + int(1.5 * max(states.values())) if swap else RuntimeConfig().device_bytes
    return {"device_bytes": budget, "largest_workspace_bytes": workspace, "state_bytes": states,
            "holds_all_states_beside_largest_call": budget >= workspace + sum(states.values())}


# -- the bench ----------------------------------------------------------------------------------
def measure(plans=JOBS, *, warmup: int = 8, steps: int = 40, rounds: int = 1, swap: bool = True,
            logs: dict | None = None, cores: tuple[int, ...] = (),
            queue_policy: str | None = None) -> dict:
    """One runtime, one worker group of 1 device. ``rounds`` times: the isolated runs (which
    calibrate the waits), then the shared run on the same group, ``steps / rounds`` timed
    steps each; the report over all rounds. Adjacent isolated and shared runs see the same
    machine, so a drift of its speed during the bench falls on both (D175). ``logs``, if given
    (one round only), receives the runtime's call and transition logs and its config
    (bench/sim_vs_runtime.py)."""
    if warmup < 1 or steps < 1:
        raise ValueError("the bench needs at least one warm-up step and one timed step")
    if rounds < 1 or steps % rounds:
        raise ValueError(f"--steps ({steps}) must be a positive multiple of --rounds ({rounds})")
    if logs is not None and rounds != 1:
        raise ValueError("the call logs are exported from a single round")
    budget = device_budget(plans, swap)
    runs = []
    config = group_config(budget["device_bytes"], cores, queue_policy)
    runtime = plexrl.connect(None, config=config)
    try:
        for index in range(rounds):   # later rounds register their jobs as <name>-r<index>
            named = [replace(p, name=f"{p.name}-r{index}") if index else p for p in plans]
            alone, tuned = [], []
            for plan in named:
                plan, row = run_isolated(runtime, plan, warmup, steps // rounds)
                alone.append(row)
                tuned.append(plan)
            shared = run_shared(runtime, tuned, warmup, steps // rounds)
            shared["jobs"] = list(shared["jobs"].values())    # in the order of ``plans``
            runs.append((tuned, alone, shared))
        if logs is not None:
            logs.update(calls=runtime.inspect("calls"), transitions=runtime.inspect("transitions"),
                        config=config)
    finally:
        runtime.close()
    tuned, alone, shared = combine(plans, runs)
    return {**report(tuned, alone, shared, steps, budget, rounds), "device_cores": list(cores),
            "queue_policy": config.queue_policy}


def combine(plans, runs: list) -> tuple[list[JobPlan], dict, dict]:
    """The rounds as one run under the plans' own names: seconds and counts summed, mean step
    times over all timed steps (each round times as many), each job's last calibration."""
    names = [p.name for p in plans]
    tuned = [replace(plan, name=name) for plan, name in zip(runs[-1][0], names)]
    alone = {}
    for i, name in enumerate(names):
        rows = [run_alone[i] for _, run_alone, _ in runs]
        alone[name] = {**total(rows), "calibration": rows[-1]["calibration"],
                       "idle_share": 1 - (sum(r["busy_s"] for r in rows)
                                          / sum(r["held_s"] for r in rows))}
    shared = total([run_shared for _, _, run_shared in runs])
    shared["jobs"] = {name: {"mean_step_s": statistics.mean(s["jobs"][i]["mean_step_s"]
                                                            for _, _, s in runs)}
                      for i, name in enumerate(names)}
    return tuned, alone, shared


def total(rows: list[dict]) -> dict:
    """Rows of one job or mode over the rounds: seconds summed, transitions summed field by
    field, a job's mean step time averaged (every round times the same number of steps)."""
    out = {**{key: sum(r[key] for r in rows) for key in SUMMED},
           "transitions": {k: sum(r["transitions"][k] for r in rows)
                           for k in rows[0]["transitions"]}}
    if "mean_step_s" in rows[0]:
        out["mean_step_s"] = statistics.mean(r["mean_step_s"] for r in rows)
    return out


SUMMED = ("wall_s", "held_s", "busy_s", "compute_s", "queued_idle_s")


def report(plans, alone: dict, shared: dict, steps: int, budget: dict, rounds: int = 1) -> dict:
    num_steps = steps * len(plans)
    isolated_device_s = sum(a["held_s"] for a in alone.values())   # 1 device, one at a time
    shared_device_s = 1 * shared["held_s"]
    for plan in plans:
        row = shared["jobs"][plan.name]
        row["slowdown"] = row["mean_step_s"] / alone[plan.name]["mean_step_s"]
    idle = {p.name: alone[p.name]["idle_share"] for p in plans}
    saving = 1 - shared_device_s / isolated_device_s
    inflation = shared["compute_s"] / sum(a["compute_s"] for a in alone.values())
    floor = sum(1 - f for f in idle.values())
    max_slowdown = max(r["slowdown"] for r in shared["jobs"].values())
    paces = [r["mean_step_s"] for r in shared["jobs"].values()]
    alone_steps = [alone[p.name]["mean_step_s"] for p in plans]
    one_pace_floor = sum(alone[p.name]["busy_s"] for p in plans) / steps / min(alone_steps)
    return _rounded({
        "steps_per_job": steps, "rounds": rounds, "jobs": [_plan_row(p) for p in plans],
        "idle_share_isolated": idle,
        "idle_share_ok": all(IDLE_SHARE_RANGE[0] <= f <= IDLE_SHARE_RANGE[1] for f in idle.values()),
        "device": budget,
        "isolated": {"num_devices": 1, "device_s": isolated_device_s,
                     "device_s_per_step": isolated_device_s / num_steps,
                     "device_s_per_step_wall": sum(a["wall_s"] for a in alone.values()) / num_steps,
                     "jobs": alone},
        "shared": {"num_devices": 1, "device_s": shared_device_s,
                   "device_s_per_step": shared_device_s / num_steps,
                   "device_s_per_step_wall": shared["wall_s"] / num_steps, **shared},
        "device_s_saving_frac": saving, "max_slowdown": max_slowdown,
        "slowdown_floor_est": floor, "compute_inflation": inflation,
        "slowdown_floor_measured": inflation * floor,
        "shared_pace_spread": max(paces) / min(paces), "slowdown_floor_one_pace": one_pace_floor,
        "targets": {"saving_frac_min": TARGET_SAVING_FRAC, "slowdown_max": TARGET_SLOWDOWN},
        "meets_saving": saving >= TARGET_SAVING_FRAC, "meets_slowdown": max_slowdown <= TARGET_SLOWDOWN})


def _plan_row(plan: JobPlan) -> dict:
    row = asdict(plan)
    row.pop("prompts")
    return {**row, "num_sequences": plan.num_sequences}


def _rounded(value):
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40, help="timed steps per job and mode")
    parser.add_argument("--warmup", type=int, default=12, help="untimed steps (calibration)")
    parser.add_argument("--rounds", type=int, default=4,
                        help="isolated-then-shared rounds the timed steps are split over")
    parser.add_argument("--no-swap", action="store_true",
                        help="the default 256 MiB device: all States fit, no swaps")
    parser.add_argument("--idle-share", type=float, default=None,
                        help="one target idle share for every job (default: JOBS)")
    parser.add_argument("--queue-policy", default=None, choices=sorted(QUEUES),
                        help="the runtime's queue policy (default: the runtime's default)")
    args = parser.parse_args()
    plans = JOBS if args.idle_share is None else tuple(replace(p, idle_share=args.idle_share)
                                                       for p in JOBS)
    cores = reserve_cores(1)   # the device's own core, as a GPU is its own (D181)
    init_local(num_devices=1)
    result = measure(plans, warmup=args.warmup, steps=args.steps, rounds=args.rounds,
                     swap=not args.no_swap, cores=cores, queue_policy=args.queue_policy)
    print(json.dumps(result))
    if not result["idle_share_ok"]:
        print(f"FAIL: an isolated idle share is outside {IDLE_SHARE_RANGE}: "
              f"{result['idle_share_isolated']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
