"""``plan(snapshot, now) -> list[Decision]``: the one scheduling entry point of PlexRL.

Owns the order of a planning cycle: admit pending jobs (Place / Reject; ``allocation``), then for every
worker group either dispatch the call its queue policy picks once the call's States are
resident, or issue the Moves that make them resident; while a call runs, prefetch the next
one's States where memory allows. Decisions are assumed into a working copy as they are
made, so later groups see earlier ones. A group the Snapshot's memo (``quiet_groups``)
knows would decide nothing is skipped, and a group found quiet is recorded there, with the
times it stays quiet (docs/design.md). Pure: same snapshot and time, same decisions.
Must not know: who executes the decisions, or how long they really take.
"""

from __future__ import annotations

import math

from plexrl.core import ledger
from plexrl.core.costs import service_s
from plexrl.core.decisions import Decision, Dispatch
from plexrl.core.allocation import admit_pending
from plexrl.core.queues import Candidate, priority_weight, queue_by_name
from plexrl.core.snapshot import ALWAYS, CallView, Snapshot
from plexrl.core.transitions import is_resident, make_resident, needed_keys, switch_in_s
from plexrl.core.usage import device_free
from plexrl.protocol import Copy, Function, State, StateKey, WorkerGroupId


def plan(snap: Snapshot, now: float) -> list[Decision]:
    """Every decision to act on now, in the order the executor should start them."""
    snap, decisions = admit_pending(snap, now)
    # every group in order, each seeing the decisions of those before it; a group the memo
    # knows to be quiet on the current working snapshot would decide nothing: skip it
    todo = snap.quiet_groups.to_plan(now)
    while todo:
        wg, todo = todo[0], todo[1:]
        acted = _plan_group(snap, wg, now)
        for decision in acted:
            snap = ledger.assume(snap, decision, now)
            decisions.append(decision)
        if acted:
            todo = [g for g in snap.quiet_groups.to_plan(now) if g > wg]
    return decisions


def runnable(snap: Snapshot, wg: WorkerGroupId) -> list[CallView]:
    """Queued calls of a group that may run next: first of their copy, version available."""
    out = []
    for call in snap.queued_by_group.get(wg, ()):
        if call.seq != snap.jobs[call.job].next_seq[call.copy_id]:
            continue
        if call.function == Function.GENERATE and not _version_ready(snap, call):
            continue
        if call.function == Function.SYNC_WEIGHTS and not _version_newer(snap, call):
            continue
        out.append(call)
    return out


def _version_ready(snap: Snapshot, call: CallView) -> bool:
    key = StateKey(call.job, call.role, call.copy, State.WEIGHTS, call.lane)
    return version_at_start(snap, call, key) == call.version


def _version_newer(snap: Snapshot, call: CallView) -> bool:
    """A sync installs a version newer than the rollout copy's, once the trainer has it."""
    key = StateKey(call.job, call.role, call.copy, State.WEIGHTS, call.lane)
    trainer = StateKey(call.job, call.role, Copy.TRAINER, State.WEIGHTS)
    return call.version > version_at_start(snap, call, key) and (
        trainer not in snap.states or version_at_start(snap, call, trainer) >= call.version)


def version_at_start(snap: Snapshot, call: CallView, key: StateKey) -> int:
    """The version of the WEIGHTS ``key`` when ``call`` would start: with ``pipeline``, after
    the call running on its group, if that one makes a version of ``key`` (an OPTIM_STEP on
    the trainer, a SYNC_WEIGHTS on the copy); a call sent behind it runs after it there."""
    version = snap.states[key].version
    running = snap.running.get(call.wg)
    if not snap.config.pipeline or running is None \
            or StateKey(running.job, running.role, running.copy, State.WEIGHTS, running.lane) != key:
        return version
    if running.function == Function.OPTIM_STEP:
        return version + 1
    return running.version if running.function == Function.SYNC_WEIGHTS else version


def _plan_group(snap: Snapshot, wg: WorkerGroupId, now: float) -> list[Decision]:
    """The group's decisions. With none, records in ``snap.quiet_groups`` the times at which
    it would have none either: the pick is all that depends on ``now``, so always when no
    other call it could pick would act, else until the queue policy could pick one."""
    calls = runnable(snap, wg)
    running = snap.running.get(wg)
    if not calls or wg in snap.behind or (running is not None and not (snap.config.prefetch
                                                                       or snap.config.pipeline)):
        snap.quiet_groups.record(wg, *ALWAYS)
        return []
    committed = next((c for c in calls if c.call == snap.onloading.get(wg)), None)
    if committed is not None:   # States are moving for it: it goes next, whatever the time
        decisions = _act_on(snap, wg, committed, running, now)
        if not decisions:
            snap.quiet_groups.record(wg, *ALWAYS)
        return decisions
    queue = queue_by_name(snap.config.queue_policy)
    candidates = [Candidate(c, now - c.queued_at, service_s(snap, c), switch_in_s(snap, c),
                            priority_weight(snap.jobs[c.job].spec.priority))
                  for c in calls]
    picked = queue.pick(candidates, snap.last_job.get(wg), snap.config.max_wait_s)
    decisions = _act_on(snap, wg, picked.call, running, now)
    if decisions:
        return decisions
    rivals = [c for c in candidates if c is not picked and _act_on(snap, wg, c.call, running, now)]
    until = queue.stable_until(candidates, picked, rivals, snap.last_job.get(wg), now,
                               snap.config.max_wait_s)
    send_at = _send_behind_at(snap, running) if running is not None and snap.config.pipeline \
        else now
    if send_at > now:   # a call may go behind the running one from then
        until = min(until, send_at)
    if until > now:
        snap.quiet_groups.record(wg, now if rivals else -math.inf, until)
    return []


def _act_on(snap: Snapshot, wg: WorkerGroupId, call: CallView,
            running: CallView | None, now: float) -> list[Decision]:
    """The decisions for ``call`` once picked. Behind a running call: dispatch it behind
    that call when it could start as that call ends and that end is near (``pipeline``),
    else prefetch. On an idle group: dispatch it when its States are resident and its
    workspace fits, else make room."""
    keys = needed_keys(snap, call)
    resident = all(is_resident(snap.states[k]) for k in keys)
    if running is not None:   # the running call's workspace is free once it ends
        spare = max(0, call.workspace_bytes - running.workspace_bytes)
        if snap.config.pipeline and resident and device_free(snap, wg) >= spare \
                and now >= _send_behind_at(snap, running):
            return [Dispatch(call=call.call, wg=wg, uses=keys)]
        if not snap.config.prefetch:
            return []
        return make_resident(snap, wg, keys, spare, protect=_in_use(snap, running),
                             reason="prefetch")
    if resident and device_free(snap, wg) >= call.workspace_bytes:
        return [Dispatch(call=call.call, wg=wg, uses=keys)]
    return make_resident(snap, wg, keys, call.workspace_bytes, protect=(), reason="onload",
                         for_call=call.call)


def _send_behind_at(snap: Snapshot, running: CallView) -> float:
    """When a call may be sent behind ``running``: ``pipeline_lead_s`` before its expected
    end. Not earlier, so that the pick behind it is made as late as the round trip allows
    (a call queued meanwhile can still be the one; D184)."""
    return running.started_at + service_s(snap, running) - snap.config.pipeline_lead_s


def _in_use(snap: Snapshot, running: CallView) -> tuple[StateKey, ...]:
    """States prefetch must not evict: the running call's, and those of its job's next
    queued call on the same copy and group (it runs next when its job's batch goes on)."""
    keys = needed_keys(snap, running)
    for call in snap.queued_by_group.get(running.wg, ()):
        if (call.job, call.role, call.copy, call.seq) == \
                (running.job, running.role, running.copy, running.seq + 1):
            return keys + tuple(k for k in needed_keys(snap, call) if k not in keys)
    return keys
