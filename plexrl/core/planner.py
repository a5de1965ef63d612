"""``plan(snapshot, now) -> list[Decision]``: the one scheduling entry point of PlexRL.

Owns the order of a planning cycle: admit pending jobs (Place / Reject; ``allocation``), then for every
worker group either dispatch the call its queue policy picks once the call's States are
resident, or issue the Moves that make them resident; while a call runs, prefetch the next
one's States where memory allows. Decisions are assumed into a working copy as they are
made, so later groups see earlier ones. Pure: same snapshot and time, same decisions.
Must not know: who executes the decisions, or how long they really take.
"""

from __future__ import annotations

from plexrl.core import ledger
from plexrl.core.costs import service_s
from plexrl.core.decisions import Decision, Dispatch
from plexrl.core.allocation import admit_pending
from plexrl.core.queues import Candidate, queue_by_name
from plexrl.core.snapshot import CallView, Snapshot
from plexrl.core.transitions import is_resident, make_resident, needed_keys, switch_in_s
from plexrl.core.usage import device_free
from plexrl.protocol import Function, State, StateKey, WorkerGroupId


def plan(snap: Snapshot, now: float) -> list[Decision]:
    """Every decision to act on now, in the order the executor should start them."""
    snap, decisions = admit_pending(snap, now)
    for wg in sorted(snap.cluster.worker_groups):
        for decision in _plan_group(snap, wg, now):
            snap = ledger.assume(snap, decision, now)
            decisions.append(decision)
    return decisions


def runnable(snap: Snapshot, wg: WorkerGroupId) -> list[CallView]:
    """Queued calls of a group that may run next: first of their copy, version available."""
    out = []
    for call in snap.queued:
        if call.wg != wg:
            continue
        if call.seq != snap.jobs[call.job].next_seq[(call.role, call.copy)]:
            continue
        if call.function == Function.GENERATE and not _version_ready(snap, call):
            continue
        if call.function == Function.SYNC_WEIGHTS and not _version_newer(snap, call):
            continue
        out.append(call)
    return out


def _version_ready(snap: Snapshot, call: CallView) -> bool:
    key = StateKey(call.job, call.role, call.copy, State.WEIGHTS)
    return snap.states[key].version == call.version


def _version_newer(snap: Snapshot, call: CallView) -> bool:
    key = StateKey(call.job, call.role, call.copy, State.WEIGHTS)
    return call.version > snap.states[key].version


def _pick(snap: Snapshot, wg: WorkerGroupId, calls: list[CallView], now: float) -> CallView:
    committed = snap.onloading.get(wg)
    for call in calls:
        if call.call == committed:
            return call
    candidates = [Candidate(c, now - c.queued_at, service_s(snap, c), switch_in_s(snap, c))
                  for c in calls]
    queue = queue_by_name(snap.config.queue_policy)
    return queue.pick(candidates, snap.last_job.get(wg), snap.config.max_wait_s).call


def _plan_group(snap: Snapshot, wg: WorkerGroupId, now: float) -> list[Decision]:
    calls = runnable(snap, wg)
    if not calls:
        return []
    running = snap.running.get(wg)
    if running is not None:
        if not snap.config.prefetch:
            return []
        nxt = _pick(snap, wg, calls, now)
        return make_resident(snap, wg, needed_keys(snap, nxt), 0,
                             protect=needed_keys(snap, running), reason="prefetch")
    call = _pick(snap, wg, calls, now)
    keys = needed_keys(snap, call)
    if all(is_resident(snap.states[k]) for k in keys) and device_free(snap, wg) >= call.workspace_bytes:
        return [Dispatch(call=call.call, wg=wg, uses=keys)]
    return make_resident(snap, wg, keys, call.workspace_bytes, protect=(), reason="onload",
                         for_call=call.call)
