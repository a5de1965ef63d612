"""The ledger folds events and assumed decisions into a new Snapshot.

Owns: ``apply(snapshot, event)`` (what happened) and ``assume(snapshot, decision, now)``
(what the executor has started: plan, assume, act, reconcile). Both are pure and return a
new Snapshot; neither decides anything. Both wear ``carry.carrying``, which hands the
old Snapshot's derived indexes and planning memo on to the new one and makes assuming the
same decision twice free. Must not know: policies, drivers, clocks.
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import replace

from plexrl.core import decisions as d
from plexrl.core import events as e
from plexrl.core.carry import carrying
from plexrl.core.cluster import Direction
from plexrl.core.costs import lane_bytes
from plexrl.core.jobs import base_bytes, keys_of, pinned_to_host, state_bytes
from plexrl.core.snapshot import CallView, JobView, Snapshot, StateView
from plexrl.core.usage import host_room
from plexrl.protocol import Function, State, StateKey, Tier, base_key, copy_id, split_copy_id


@carrying(remember=False)
def apply(snap: Snapshot, event: e.Event) -> Snapshot:
    """Fold one event into the snapshot."""
    match event:
        case e.JobSubmitted(spec=spec):
            return replace(snap, pending=snap.pending + (spec,))
        case e.CallQueued():
            return replace(snap, queued=snap.queued + (_call_view(snap, event),))
        case e.CallFinished():
            return _call_finished(snap, event)
        case e.TransitionFinished():
            return _transition_finished(snap, event)
        case e.JobProgress(job=job):
            if job not in snap.jobs:
                return snap
            jobs = dict(snap.jobs)
            jobs[job] = replace(jobs[job], steps_done=event.steps_done, step_s=event.step_s,
                                progress_at=event.at)
            return replace(snap, jobs=jobs)
        case e.JobEnded(job=job, at=at):
            return _job_ended(snap, job, at)
        case e.WorkerLost(wg=wg, at=at):
            lost = {j for j, v in snap.jobs.items() if wg in v.bindings.values()}
            for job in sorted(lost):
                snap = _job_ended(snap, job, at)
            return snap
    raise TypeError(f"not an event: {event!r}")


@carrying(remember=True)
def assume(snap: Snapshot, decision: d.Decision, now: float) -> Snapshot:
    """Record a decision the executor has started, so the next plan sees it."""
    match decision:
        case d.Place(carve=carve):
            if carve is not None:
                snap = replace(snap, cluster=snap.cluster.with_group(carve))
            return _place(snap, decision, now)
        case d.Reject(job=job):
            return replace(snap, pending=tuple(s for s in snap.pending if s.job != job))
        case d.Dispatch(call=call_id, wg=wg):
            call = next((c for c in snap.queued_by_group.get(wg, ()) if c.call == call_id), None) \
                or next(c for c in snap.queued if c.call == call_id)
            at = _position(snap.queued, call)
            job = snap.jobs[call.job]
            next_seq = dict(job.next_seq)
            next_seq[call.copy_id] = call.seq + 1
            jobs = dict(snap.jobs)
            jobs[call.job] = replace(job, next_seq=next_seq)
            running, behind = dict(snap.running), snap.behind
            if wg in running:   # pipelined: it starts when the running call ends
                behind = {**behind, wg: call}
            else:
                running[wg] = replace(call, started_at=now)
            last = dict(snap.last_job)
            last[wg] = call.job
            onloading = {w: c for w, c in snap.onloading.items() if w != wg}
            return replace(snap, queued=snap.queued[:at] + snap.queued[at + 1:], running=running,
                           behind=behind, jobs=jobs, last_job=last, onloading=onloading)
        case d.Move(key=key, dst=dst, for_call=for_call, wg=wg):
            states = dict(snap.states)
            states[key] = replace(states[key], moving_to=dst)
            onloading = snap.onloading
            if for_call is not None:
                onloading = dict(onloading)
                onloading[wg] = for_call
            return replace(snap, states=states, onloading=onloading)
    raise TypeError(f"not a decision: {decision!r}")


def _position(calls: tuple[CallView, ...], call: CallView) -> int:
    """Where ``call`` (this very object) is in ``calls``: compared by identity, in C."""
    return next(itertools.compress(itertools.count(), map(operator.is_, calls,
                                                          itertools.repeat(call))))


def _call_view(snap: Snapshot, ev: e.CallQueued) -> CallView:
    view = CallView(call=ev.call, job=ev.job, seq=ev.seq, function=ev.function, role=ev.role,
                    wg="", queued_at=ev.at, step=ev.step, num_tokens=ev.num_tokens, version=ev.version,
                    workspace_bytes=ev.workspace_bytes, lane=ev.lane)
    job = snap.jobs.get(ev.job)
    if job is None or view.copy_id not in job.bindings:
        lane = f" lane {ev.lane}" if ev.lane else ""
        raise KeyError(f"call {ev.call}: job {ev.job} has no placed {ev.role}/{view.copy}{lane} copy")
    return replace(view, wg=job.bindings[view.copy_id])


def _call_finished(snap: Snapshot, ev: e.CallFinished) -> Snapshot:
    call = snap.running.get(ev.wg)
    if call is None or call.call != ev.call:
        raise KeyError(f"call {ev.call} is not running on {ev.wg}")
    running = {w: c for w, c in snap.running.items() if w != ev.wg}
    states = snap.states
    if call.function in (Function.OPTIM_STEP, Function.LOAD, Function.SYNC_WEIGHTS):
        # a step or a restored checkpoint makes a new trainer version; a sync installs one
        key = StateKey(call.job, call.role, call.copy, State.WEIGHTS, call.lane)
        # (a LOAD that names the version it restores, as a resumed job's does, installs it)
        named = call.function == Function.SYNC_WEIGHTS or (
            call.function == Function.LOAD and call.version > states[key].version)
        new_version = call.version if named else states[key].version + 1
        states = dict(states)
        states[key] = replace(states[key], version=new_version)
    est = snap.estimates.observe_service(call.job, call.function, ev.duration_s,
                                         snap.config.ema_alpha)
    running, behind = _promoted(snap, running, ev.at)
    return replace(snap, running=running, behind=behind, states=states, estimates=est)


def _promoted(snap: Snapshot, running: dict, at: float) -> tuple[dict, dict]:
    """``running`` with each call behind a group that no longer runs one started at ``at``,
    and what stays behind."""
    behind = {}
    for wg, call in snap.behind.items():
        if wg in running:
            behind[wg] = call
        else:
            running[wg] = replace(call, started_at=at)
    return running, behind


def _transition_finished(snap: Snapshot, ev: e.TransitionFinished) -> Snapshot:
    if ev.key not in snap.states:
        return snap  # the job ended while its State moved; its bytes were released then
    states = dict(snap.states)
    view = states[ev.key]
    states[ev.key] = replace(view, tier=ev.dst, moving_to=None)
    est = snap.estimates
    direction = Direction.of(ev.src, ev.dst)
    node = snap.cluster.node_of(view.wg)
    moving_s = ev.duration_s - node.move_latency_s
    if direction is not None and moving_s > 0 and ev.num_bytes > 0:
        per_lane = lane_bytes(snap.cluster, view.wg, direction, ev.num_bytes)
        est = est.observe_transfer(node.node, direction, per_lane / moving_s, snap.config.ema_alpha)
    return replace(snap, states=states, estimates=est)


def _job_ended(snap: Snapshot, job, at: float) -> Snapshot:
    """Forget a job and release the groups cut for it that no other job is bound to; a call
    behind one of its calls starts at ``at``.

    Idempotent: ending an unknown or already ended job changes nothing.
    """
    if job not in snap.jobs and all(s.job != job for s in snap.pending):
        return snap
    jobs = {j: v for j, v in snap.jobs.items() if j != job}
    bases = _bases(jobs)
    states = {k: v for k, v in snap.states.items()
              if k.job != job and (k.state != State.BASE or k in bases)}
    queued = tuple(c for c in snap.queued if c.job != job)
    snap = replace(snap, behind={w: c for w, c in snap.behind.items() if c.job != job})
    running = {w: c for w, c in snap.running.items() if c.job != job}
    running, behind = _promoted(snap, running, at)
    pending = tuple(s for s in snap.pending if s.job != job)
    cluster, last_job, onloading = snap.cluster, snap.last_job, snap.onloading
    ended = snap.jobs.get(job)
    if ended is not None:
        still = {wg for v in jobs.values() for wg in v.bindings.values()}
        freed = {wg for wg in ended.bindings.values()
                 if wg not in still and cluster.worker_groups[wg].carved}
        if freed:
            cluster = cluster.without_groups(freed)
            last_job = {w: j for w, j in last_job.items() if w not in freed}
            onloading = {w: c for w, c in onloading.items() if w not in freed}
    return replace(snap, cluster=cluster, jobs=jobs, states=states, queued=queued, running=running,
                   behind=behind, pending=pending, last_job=last_job, onloading=onloading)


def _bases(jobs: dict) -> set[StateKey]:
    """The BASE States the bound LoRA models of ``jobs`` use: a base lives while one does."""
    return {base_key(decl.spec.base, wg) for view in jobs.values()
            for cid, wg in view.bindings.items()
            for decl in (view.spec.model(split_copy_id(cid)[0]),) if decl.spec.lora}


def _place(snap: Snapshot, p: d.Place, now: float) -> Snapshot:
    spec = next(s for s in snap.pending if s.job == p.job)
    job = snap.jobs.get(p.job) or JobView(spec=spec, bindings={}, next_seq={}, admitted_at=now)
    bindings = dict(job.bindings)
    bindings[copy_id(p.role, p.copy, p.lane)] = p.wg
    next_seq = dict(job.next_seq)
    next_seq[copy_id(p.role, p.copy, p.lane)] = 0
    jobs = dict(snap.jobs)
    jobs[p.job] = replace(job, bindings=bindings, next_seq=next_seq)
    states = dict(snap.states)
    decl = spec.model(p.role)
    group = snap.cluster.worker_groups[p.wg]
    usable = snap.cluster.device_of(p.wg).usable_bytes
    # a new job's States start on HOST while it has room, else DISK; pinned ones (admission
    # checked their room) are counted first
    keys = sorted(keys_of(p.job, decl, p.copy, p.lane), key=lambda k: not pinned_to_host(decl, k.state))
    room = host_room(snap, p.wg)
    for key in keys:
        nbytes = state_bytes(decl, p.copy, key.state, group.num_devices, usable)
        pinned = pinned_to_host(decl, key.state)
        tier = Tier.DROPPED if key.state == State.KV_CACHE else Tier.HOST
        if tier == Tier.HOST and not pinned and nbytes > room:
            tier = Tier.DISK
        elif tier == Tier.HOST:
            room -= nbytes
        states[key] = StateView(key=key, wg=p.wg, num_bytes=nbytes, tier=tier, pinned=pinned)
    base = base_key(decl.spec.base, p.wg)
    if decl.spec.lora and base not in states:   # the first LoRA job on this base here
        nbytes = base_bytes(decl.spec, group.num_devices)
        states[base] = StateView(key=base, wg=p.wg, num_bytes=nbytes,
                                 tier=Tier.HOST if nbytes <= room else Tier.DISK)
    pending = snap.pending
    placed = spec.copy_ids <= set(bindings)
    if placed:
        pending = tuple(s for s in snap.pending if s.job != p.job)
    return replace(snap, jobs=jobs, states=states, pending=pending)

