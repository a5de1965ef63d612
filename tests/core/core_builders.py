"""Hand-built clusters, jobs and snapshots for the core's tests (STYLE.md rule 11).

Sizes are tiny whole numbers of bytes so a test can say by hand what fits: a device holds
``DEVICE_BYTES`` (all usable), a trainer copy of ``P`` parameters on one device holds
WEIGHTS 2P, GRADS 4P and OPTIMIZER 12P bytes, a rollout copy WEIGHTS 2P and a KV cache of
the rest. Bandwidths are bytes per second per lane (``BW``). Everything goes through the
core's own ledger (JobSubmitted, Place, Dispatch), so the snapshots are ones a driver could
really reach; ``with_tiers`` then puts States where a test wants them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Mapping

from plexrl.core import apply, assume, plan
from plexrl.core import events as ev
from plexrl.core.cluster import ClusterSpec, DeviceSpec, Direction, NodeSpec, WorkerGroupSpec
from plexrl.core.decisions import Dispatch, Place
from plexrl.core.jobs import JobSpec, ModelDecl
from plexrl.core.snapshot import CoreConfig, Snapshot
from plexrl.core.transitions import needed_keys
from plexrl.protocol import Copy, Function, ModelSpec, Role, State, StateKey, Tier

DEVICE_BYTES = 1000.0
BW = {Direction.ONLOAD: 100.0, Direction.OFFLOAD: 100.0, Direction.SPILL: 50.0,
      Direction.RESTORE: 50.0}
DEVICE = DeviceSpec("tiny", memory_bytes=DEVICE_BYTES, usable_frac=1.0, peak_flops=1e4,
                    hbm_bytes_per_s=1e4)


def cluster(groups: dict[str, tuple[int, tuple[str, ...]]], host: dict[str, float], *,
            latency_s: float = 0.0, device: DeviceSpec = DEVICE,
            disk_bytes: float = 1e12) -> ClusterSpec:
    """``groups``: wg -> (num_devices, nodes); ``host``: node -> host bytes."""
    nodes = {n: NodeSpec(n, 8, device, h, disk_bytes, dict(BW), latency_s) for n, h in host.items()}
    wgs = {wg: WorkerGroupSpec(wg, tuple(ns), num) for wg, (num, ns) in groups.items()}
    return ClusterSpec(nodes=nodes, worker_groups=wgs)


def one_group(host_bytes: float = 1e9, **kw) -> ClusterSpec:
    """One worker group ``g0`` of one device on node ``n0``."""
    return cluster({"g0": (1, ("n0",))}, {"n0": host_bytes}, **kw)


def model(params: float, *, name: str = "m", trainable: bool = True, optimizer: str = "adamw",
          rollout_tp: int = 1) -> ModelSpec:
    return ModelSpec(name=name, total_params=params, active_params=params, num_layers=2,
                     kv_heads=1, head_dim=4, rollout_tp=rollout_tp, optimizer=optimizer,
                     trainable=trainable)


def trainer_job(job: str, params: float, wg: str | tuple[str, ...] = "g0", *,
                optimizer: str = "adamw", trainable: bool = True,
                role: Role = Role.POLICY) -> JobSpec:
    """A job with one model that has only a trainer copy (a frozen model: WEIGHTS only)."""
    groups = (wg,) if isinstance(wg, str) else wg
    decl = ModelDecl(role, model(params, optimizer=optimizer, trainable=trainable), (Copy.TRAINER,))
    return JobSpec(job=job, models=(decl,), candidates=((role, Copy.TRAINER, groups),))


def rl_job(job: str, params: float, trainer_wg: str, rollout_wg: str, *, staleness: int = 0,
           rollout_tp: int = 1) -> JobSpec:
    """A job whose policy has a trainer copy and a rollout copy (colocated if the groups match)."""
    decl = ModelDecl(Role.POLICY, model(params, rollout_tp=rollout_tp),
                     (Copy.TRAINER, Copy.ROLLOUT))
    return JobSpec(job=job, models=(decl,), staleness=staleness,
                   candidates=((Role.POLICY, Copy.TRAINER, (trainer_wg,)),
                               (Role.POLICY, Copy.ROLLOUT, (rollout_wg,))))


def rollout_job(job: str, params: float, wg: str = "g0") -> JobSpec:
    """A job with only a rollout copy of its policy (WEIGHTS 2P per instance, KV the rest)."""
    decl = ModelDecl(Role.POLICY, model(params), (Copy.ROLLOUT,))
    return JobSpec(job=job, models=(decl,), candidates=((Role.POLICY, Copy.ROLLOUT, (wg,)),))


def admitted(clus: ClusterSpec, *specs: JobSpec, config: CoreConfig = CoreConfig()) -> Snapshot:
    """A snapshot with every job submitted and placed by the core's own admission."""
    snap = Snapshot(cluster=clus, config=config)
    for spec in specs:
        snap = apply(snap, ev.JobSubmitted(spec=spec, at=0.0))
    for decision in plan(snap, 0.0):
        assert isinstance(decision, Place), decision
        snap = assume(snap, decision, 0.0)
    assert not snap.pending
    return snap


def key(job: str, state: State, copy: Copy = Copy.TRAINER, role: Role = Role.POLICY) -> StateKey:
    return StateKey(job, role, copy, state)


def with_tiers(snap: Snapshot, tiers: Mapping[StateKey, Tier], *,
               job_tiers: Mapping[str, Tier] | None = None,
               versions: Mapping[StateKey, int] | None = None) -> Snapshot:
    """Put States on tiers (``job_tiers``: every non-KV State of a job), set weight versions."""
    states = dict(snap.states)
    for k, view in states.items():
        if job_tiers and k.job in job_tiers and k.state != State.KV_CACHE:
            states[k] = replace(view, tier=job_tiers[k.job])
    for k, tier in tiers.items():
        states[k] = replace(states[k], tier=tier)
    for k, version in (versions or {}).items():
        states[k] = replace(states[k], version=version)
    return replace(snap, states=states)


def queue(snap: Snapshot, call: int, job: str, seq: int, function: Function, *,
          role: Role = Role.POLICY, at: float = 0.0, **fields) -> Snapshot:
    return apply(snap, ev.CallQueued(call=call, job=job, seq=seq, function=function, role=role,
                                     at=at, **fields))


def dispatch(snap: Snapshot, call: int, now: float = 0.0) -> Snapshot:
    """Start a queued call as the core would (on its bound group, with its needed States)."""
    view = next(c for c in snap.queued if c.call == call)
    return assume(snap, Dispatch(call=call, wg=view.wg, uses=needed_keys(snap, view)), now)


def call_view(snap: Snapshot, call: int):
    return next(c for c in snap.queued if c.call == call)
