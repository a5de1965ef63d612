"""A simulated engine behind the service interface: many jobs per worker group, no torch.

Owns: ``SimulatedService``, which answers everything ``service.Service`` answers (bind,
unbind, run, move, holdings, checkpoint, stats...) with the same checks -- a call carries
its job's token and comes in its model copy's order -- but holds no bytes: a State is its
tier and version, a call sleeps ``call_s`` and answers small arrays that depend only on the
job's seed and the call (so two runs of a job answer alike), a move sleeps a little, and a
checkpoint is a small JSON file. For load tests of the control plane (``engine="simulated"``
in ``RuntimeConfig``): a hundred jobs fit where a hundred models would not.
Must not know: torch, the Snapshot, policies, why a call or a move was chosen.
"""

from __future__ import annotations

import json
import os
import threading
import time
import zlib
from dataclasses import dataclass, field

import numpy as np

from plexrl.errors import CallError
from plexrl.protocol import Copy, Function, ModelSpec, Role, State, StateKey, Tier, copy_label
from plexrl.runtime.workers.order import (CallOrder, copies_of, hosted_job, next_seq_labels,
                                         take_turn)

MOVE_S = 0.0005   #: seconds a simulated transition takes


@dataclass
class _Model:
    seed: int
    bound: set = field(default_factory=set)          #: (copy, lane) bound here
    optim_steps: int = 0
    rollout_version: int = 0


@dataclass
class _Job:
    token: str
    seed: int
    models: dict = field(default_factory=dict)       #: role -> _Model
    next_seq: dict = field(default_factory=dict)     #: (role, copy) -> next copy order
    tiers: dict = field(default_factory=dict)        #: State name -> Tier


class SimulatedService:
    def __init__(self, wg: str, budget_bytes: int, host_root: str, threads: int,
                 skip_onload: tuple[str, ...] = (), spill_root: str | None = None,
                 fail_at: tuple[str, ...] = (), call_s: float = 0.002):
        self.wg, self.call_s = wg, call_s
        self.jobs: dict[str, _Job] = {}
        self.log: list[dict] = []
        self._lock = threading.Lock()

    def ready(self) -> dict:
        return {"wg": self.wg, "pid": os.getpid(), "threads": 0, "engine": "simulated"}

    def close(self) -> None:
        pass

    # -- jobs ---------------------------------------------------------------------------------
    def bind(self, job: str, token: str, role: Role, copy: Copy, spec: ModelSpec, seed: int,
             sizes: dict[State, int], tiers: dict[State, Tier] | None = None,
             lane: int = 0) -> None:
        with self._lock:
            hosted = self.jobs.setdefault(job, _Job(token, seed))
            model = hosted.models.setdefault(role, _Model(seed))
            for state in sizes:
                if state != State.KV_CACHE:
                    hosted.tiers[str(StateKey(job, role, copy, state, lane))] = \
                        (tiers or {}).get(state, Tier.HOST)
            model.bound.add((copy, lane))
            assert {c for c, _ in model.bound} <= set(copies_of(role, spec))

    def unbind(self, job: str) -> None:
        with self._lock:
            self.jobs.pop(job, None)

    def holdings(self) -> dict:
        held = {}
        for job, hosted in self.jobs.items():
            states = {}
            for role, model in hosted.models.items():
                for copy, lane in model.bound:
                    version = model.rollout_version if copy == Copy.ROLLOUT else model.optim_steps
                    for state in State:
                        tier = hosted.tiers.get(str(StateKey(job, role, copy, state, lane)))
                        if tier is not None:
                            states[f"{role}/{copy_label(copy, lane)}/{state}"] = (str(tier),
                                                                                  version)
            held[job] = {"token": hosted.token, "states": states,
                         "next_seq": next_seq_labels(hosted.next_seq)}
        return held

    # -- transitions --------------------------------------------------------------------------
    def move(self, key: StateKey, src: Tier, dst: Tier, reason: str) -> dict:
        time.sleep(MOVE_S)
        hosted = self.jobs.get(key.job)
        if hosted is not None:
            hosted.tiers[str(key)] = dst
        self.log.append({"key": str(key), "job": key.job, "wg": self.wg, "src": str(src),
                         "dst": str(dst), "reason": reason, "end_s": time.monotonic()})
        return {"seconds": MOVE_S, "num_bytes": 0}

    def transitions(self, failed: bool = False) -> list[dict]:
        return [] if failed else list(self.log)

    def stats(self) -> dict:
        on = {tier: 0 for tier in Tier}
        for hosted in self.jobs.values():
            for tier in hosted.tiers.values():
                on[tier] += 1
        return {"device_bytes": 0, "reserved_bytes": 0, "host_bytes": 0, "disk_bytes": 0,
                "disk_files": 0, "num_states": sum(on.values()), "num_copies": sum(on.values()),
                "jobs": sorted(self.jobs), "rss_bytes": 0,
                "states_on": {str(t): n for t, n in on.items()}}

    # -- calls --------------------------------------------------------------------------------
    def check_token(self, request) -> _Job:
        return hosted_job(self.jobs, self.wg, request)

    def run(self, order: CallOrder, payload) -> dict:
        request = order.request
        hosted = self.check_token(request)
        take_turn(hosted, order)
        model = hosted.models[request.role]
        time.sleep(self.call_s)
        rng = np.random.default_rng([hosted.seed, order.copy_seq,
                                     zlib.crc32(str(request.function).encode())])
        match request.function:
            case Function.GENERATE:
                n = max(request.num_sequences, 1)
                tokens = rng.integers(0, 64, size=(n, request.max_tokens))
                return {"tokens": tokens, "lengths": np.full(n, request.max_tokens),
                        "logprobs": -rng.random((n, request.max_tokens)).astype(np.float32),
                        "version": model.rollout_version}
            case Function.LOGPROBS:
                shape = (max(request.num_sequences, 1), max(request.seq_len, 1))
                return {"logprobs": -rng.random(shape).astype(np.float32)}
            case Function.FORWARD_BACKWARD:
                return {"loss": float(rng.random())}
            case Function.OPTIM_STEP:
                model.optim_steps += 1
                return {"version": model.optim_steps}
            case Function.SYNC_WEIGHTS:
                model.rollout_version = request.version
                return {"version": request.version}
            case Function.SAVE:
                path = str(request.option("path"))
                self._write(path, model)
                return {"path": path, "optim_steps": model.optim_steps}
            case Function.LOAD:
                path = str(request.option("path"))
                try:
                    with open(path) as f:
                        model.optim_steps = json.load(f)["optim_steps"]
                except (OSError, ValueError, KeyError) as err:
                    raise CallError(f"job {request.job}: cannot load {path}: {err}",
                                    job=request.job, seq=request.seq, function="load") from None
                if request.version:
                    model.optim_steps = request.version
                return {"path": path}
        raise CallError(f"no such function {request.function}", job=request.job)

    def checkpoint(self, job: str, role: Role, path: str) -> dict:
        model = self.jobs[job].models[Role(role)]
        self._write(path, model)
        return {"path": path, "optim_steps": model.optim_steps}

    @staticmethod
    def _write(path: str, model: _Model) -> None:
        with open(path, "w") as f:
            json.dump({"optim_steps": model.optim_steps, "seed": model.seed}, f)
