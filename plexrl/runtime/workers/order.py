"""The order of a job's calls on a service: what a dispatched call carries, and the checks.

Owns: ``CallOrder`` (what the controller sends a service with a dispatched call, its
payload beside it), ``copies_of`` (which model copies a role has: a trained policy a trainer
and a rollout copy, every other model a trainer copy), ``hosted_job`` (the call carries its
job's token) and ``take_turn`` (the call is the next on its model copy). The real service and
the simulated one check alike. Must not know: Ray, torch, scheduling.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from plexrl.errors import AuthError, OrderError
from plexrl.protocol import CallId, CallRequest, Copy, ModelSpec, Role, copy_label, split_copy_id


def copies_of(role: Role, spec: ModelSpec) -> tuple[Copy, ...]:
    """A trained policy has a trainer and a rollout copy; every other model a trainer copy."""
    return (Copy.TRAINER, Copy.ROLLOUT) if role == Role.POLICY and spec.trainable else (Copy.TRAINER,)


@dataclass(frozen=True)
class CallOrder:
    """What the controller sends the service with a dispatched call (its payload goes beside)."""

    request: CallRequest         #: without its payload
    call: CallId
    workspace_bytes: int         #: device bytes reserved while it runs
    copy_seq: int = 0            #: its place among its job's calls on its model copy, from 0
    after: tuple[str, int] | None = None   #: (job, seq) of the call it was sent behind
    #: a SYNC_WEIGHTS whose trainer copy is on another worker group: that group's service,
    #: which gives the trainer's whole weights (``ServiceActor.whole_weights``)
    source: object = None


def hosted_job(jobs: dict, wg: str, request: CallRequest):
    """A service's record of the call's job, if the call carries that job's token (the real
    service and the simulated one check alike)."""
    hosted = jobs.get(request.job)
    if hosted is None or not secrets.compare_digest(hosted.token, request.token):
        raise AuthError(f"worker group {wg}: job {request.job} is unknown here or the token is "
                        "not this job's; calls must carry their job's ticket", job=request.job)
    return hosted


def take_turn(hosted, order: CallOrder) -> None:
    """The call is the next on its model copy (``hosted.next_seq``), which moves on."""
    request = order.request
    copy = request.copy_id
    expected = hosted.next_seq.get(copy, 0)
    if order.copy_seq != expected:
        raise OrderError(f"job {request.job}: call {request.seq} is number {order.copy_seq} on "
                         f"its {request.role}/{copy_label(request.copy, request.lane)} copy, but "
                         f"number {expected} runs next", job=request.job, seq=request.seq)
    hosted.next_seq[copy] = expected + 1


def next_seq_labels(next_seq: dict) -> dict[str, int]:
    """A service's next call per copy, keyed as text: ``policy/rollout``, ``policy/rollout#1``."""
    out = {}
    for key, n in next_seq.items():
        role, copy, lane = split_copy_id(key)
        out[f"{role}/{copy_label(copy, lane)}"] = n
    return out
