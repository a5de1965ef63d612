"""Drive the demo's jobs on the local runtime: all at once (one thread each) or one after
another, each alone; and what the controller's call log says about the worker group.

Owns: the runtime the demo starts (one worker group of 1 emulated device, the default
256 MiB budget: every job's States fit beside any call, so jobs interleave without swaps --
docs/design.md, D111-D115), one job's run (register, supervised warm-up, greedy accuracy, GRPO
with the job's remote verifier, greedy accuracy) reported to a ``Progress``, and the usage
figures (held, busy, idle share, device-seconds).
Must not know: argument parsing, record files, plots.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import numpy as np

from plexrl.demo.plan import HELDOUT, DemoJob, make_task, make_tokenizer
from plexrl.demo.progress import Progress
from plexrl.demo.verifier import remote_verifier
from plexrl.rl.grpo import greedy_accuracy, train
from plexrl.rl.rewards import Rewards, verifier_reward
from plexrl.rl.sft import supervised_warmup

WORKER_GROUP = "wg0"


@dataclass
class JobResult:
    name: str
    warmup_steps: int
    acc_before: float
    acc_after: float
    rewards: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)     #: wall seconds of each GRPO step
    wall_s: float = 0.0                                   #: whole job, warm-up included

    @property
    def fifths(self) -> tuple[float, float]:
        """Mean reward of the first and of the last 20% of the GRPO steps."""
        k = max(1, len(self.rewards) // 5)
        return float(np.mean(self.rewards[:k])), float(np.mean(self.rewards[-k:]))

    @property
    def mean_step_s(self) -> float:
        return float(np.mean(self.step_s))


def start_runtime(device_bytes: int | None = None, threads: int = 1, devices: int = 1):
    """The local runtime: one worker group of ``devices`` emulated devices (each model
    sharded over them), ``threads`` torch threads per rank."""
    import ray

    import plexrl
    from plexrl.runtime.config import RuntimeConfig, WorkerGroupConfig
    from plexrl.runtime.transport import init_local
    if not ray.is_initialized():
        init_local(num_devices=devices, num_cpus=2)
    settings = {} if device_bytes is None else {"device_bytes": device_bytes}
    config = RuntimeConfig(worker_groups=(WorkerGroupConfig(WORKER_GROUP, devices),), threads=threads,
                           **settings)
    return plexrl.connect(None, config=config)


def run_job(runtime, job: DemoJob, progress: Progress, name: str | None = None) -> JobResult:
    """Register ``job`` (as ``name``), warm it up, evaluate, train with GRPO, evaluate, end."""
    from plexrl.runtime.models import model_spec
    task = make_task(job)
    tok = make_tokenizer(task)
    spec = model_spec("policy", source=job.source)
    tok.check_fits(spec.vocab_size)
    held = task.sample(HELDOUT, seed=job.seed, split="heldout")
    client = runtime.register_job(name or job.name, {"policy": spec}, seed=job.seed)
    start = time.monotonic()
    shown = job.name
    rewards = Rewards([remote_verifier(verifier_reward(task), job.verifier_s)])
    try:
        progress.say(shown, f"{job.task} on {job.source}: supervised warm-up "
                            f"{job.warmup_steps} steps, then GRPO {job.steps} steps; remote "
                            f"verifier {job.verifier_s * 1000:.0f} ms a round")
        progress.phase(shown, "warm-up", job.warmup_steps)
        _, version = supervised_warmup(client, task, tok, job.warmup_steps, batch_size=32,
                                       lr=job.warmup_lr, seed=job.seed,
                                       on_step=lambda i, _nll: progress.step(shown, i + 1))
        progress.phase(shown, "eval")
        before = greedy_accuracy(client, task, tok, held, version=version,
                                 max_tokens=job.max_tokens)
        progress.say(shown, f"after warm-up: greedy accuracy {before:.3f} on {HELDOUT} "
                            f"held-out prompts")
        progress.phase(shown, "GRPO", job.steps)
        records = train(client, task, tok, job.grpo(), job.steps, start_version=version,
                        rewards=rewards,
                        on_step=lambda r: progress.step(shown, r.step + 1, r.reward_mean))
        progress.phase(shown, "eval")
        after = greedy_accuracy(client, task, tok, held, version=records[-1].version,
                                max_tokens=job.max_tokens)
        result = JobResult(job.name, job.warmup_steps, before, after,
                           [r.reward_mean for r in records], [r.step_s for r in records],
                           time.monotonic() - start)
        progress.phase(shown, "done")
        first, last = result.fifths
        progress.say(shown, f"done: reward {first:.3f} -> {last:.3f}, greedy accuracy "
                            f"{before:.3f} -> {after:.3f}")
        return result
    finally:
        client.end()


def run_shared(runtime, jobs, progress: Progress, prefix: str = "") -> dict[str, JobResult]:
    """Every job at once on the one worker group, one driver thread each."""
    results, errors = {}, []

    def driver(job: DemoJob) -> None:
        try:
            results[job.name] = run_job(runtime, job, progress, prefix + job.name)
        except BaseException as err:  # noqa: BLE001 -- re-raised after the join
            errors.append(err)
    threads = [threading.Thread(target=driver, args=(j,), name=j.name) for j in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return {j.name: results[j.name] for j in jobs}


def run_isolated(runtime, jobs, progress: Progress, prefix: str = "") -> dict[str, JobResult]:
    """The same jobs one after another, each alone on the worker group."""
    return {j.name: run_job(runtime, j, progress, prefix + j.name) for j in jobs}


def usage(calls: list[dict], jobs, prefix: str = "") -> dict:
    """Held, busy and per-job seconds of the worker group from the call log: held = first
    call's start to last call's end of these jobs (per job when isolated, summed: the group
    holds each job alone); busy = seconds it ran their calls; a job's idle share = 1 - its
    busy / its held seconds."""
    names = {prefix + j.name: j.name for j in jobs}
    mine = [c for c in calls if c["job"] in names and not c["failed"]]
    per_job = {}
    for full, short in names.items():
        own = [c for c in mine if c["job"] == full]
        held = max(c["end_s"] for c in own) - min(c["start_s"] for c in own)
        busy = sum(c["end_s"] - c["start_s"] for c in own)
        per_job[short] = {"held_s": held, "busy_s": busy, "idle_share": 1 - busy / held,
                          "calls": len(own)}
    return {"held_s": max(c["end_s"] for c in mine) - min(c["start_s"] for c in mine),
            "busy_s": sum(c["end_s"] - c["start_s"] for c in mine), "jobs": per_job,
            "grpo_steps": sum(j.steps for j in jobs),
            "steps": sum(j.steps + j.warmup_steps for j in jobs)}
