"""Carrying a Snapshot's derived indexes, and the planner's quiet groups, to the next one.

Owns: ``Delta`` (what one fold changed: States, queued calls, per-group fields), how to find
it for each event and decision (by rule for the frequent ones, by comparing the two
Snapshots for any other), ``touched`` (the worker groups whose planning inputs a Delta can
change: the definition of a dirty group, docs/design.md P1), and ``carrying``, which
the ledger's folds wear: fold, then hand every derived value the old Snapshot has computed
to the new one, updated by the Delta; ``assume`` also remembers its result, so a decision
the planner assumed is not assumed again by the driver. Must not know: policies, drivers,
clocks.
"""

from __future__ import annotations

import functools
import itertools
import operator
from dataclasses import dataclass

from plexrl.core import decisions as d
from plexrl.core import events as e
from plexrl.core.jobs import keys_of
from plexrl.core.snapshot import CallView, Snapshot
from plexrl.protocol import JobId, State, StateKey, WorkerGroupId, base_key

#: Derived values that depend on the cluster alone (a fold that changes the cluster, as
#: cutting or releasing a worker group does, carries nothing: the new Snapshot starts afresh).
_CLUSTER_DERIVED = ("group_order", "groups_on_node", "neighbours", "free_devices")
_ASSUMED = "_assumed"            #: per Snapshot: (decision, now) -> the Snapshot assumed


@dataclass(frozen=True)
class Delta:
    """What one fold changed, in the terms the derived values and the quiet groups need."""

    states: tuple[StateKey, ...] = ()          #: States added, removed or replaced
    calls_added: tuple[CallView, ...] = ()     #: appended to ``queued``
    calls_removed: tuple[CallView, ...] = ()   #: gone from ``queued`` (matched by call id)
    #: groups whose running call, onloading call, last job, a bound copy's next_seq, or the
    #: learned service time of a bound job changed
    groups: frozenset[WorkerGroupId] = frozenset()
    rebound: tuple[JobId, ...] = ()            #: jobs placed, given a copy, or gone


def carrying(remember: bool):
    """Decorate a fold ``(snapshot, change, *args) -> Snapshot`` (``ledger.apply``/``assume``)."""
    def wrap(fold):
        @functools.wraps(fold)
        def folded(snap: Snapshot, change, *args) -> Snapshot:
            memo = snap.__dict__.get(_ASSUMED) if remember else None
            if memo is not None and (change, *args) in memo:
                return memo[(change, *args)]
            new = fold(snap, change, *args)
            if new is snap:   # nothing changed (an event about what is already gone)
                return new
            carry(snap, new, delta_of(snap, new, change))
            if remember:
                snap.__dict__.setdefault(_ASSUMED, {})[(change, *args)] = new
            return new
        return folded
    return wrap


def delta_of(old: Snapshot, new: Snapshot, change) -> Delta:
    """The Delta of one fold, by rule for events and decisions whose effect is known."""
    match change:
        case e.JobSubmitted() | e.JobProgress() | d.Reject():
            return Delta()   # pending jobs and progress feed admission, which always runs
        case e.CallQueued():
            return Delta(calls_added=new.queued[len(old.queued):])
        case e.CallFinished(wg=wg):
            call = old.running[wg]
            weights = StateKey(call.job, call.role, call.copy, State.WEIGHTS, call.lane)
            # its job's learned service times feed the queue policy on all the job's groups
            return Delta(states=(weights,) if new.states is not old.states else (),
                         groups=frozenset((wg, *old.jobs[call.job].bindings.values())))
        case e.TransitionFinished(key=key) if key not in old.states:
            return Delta()   # its job (or a base's last job) ended while it moved
        case e.TransitionFinished(key=key) | d.Move(key=key, for_call=None):
            return Delta(states=(key,))
        case d.Move(key=key, wg=wg):
            return Delta(states=(key,), groups=frozenset((wg,)))
        case d.Dispatch(wg=wg):
            return Delta(calls_removed=(new.behind.get(wg) or new.running[wg],),
                         groups=frozenset((wg,)))
        case d.Place(job=job, role=role, copy=copy, wg=wg, carve=None, lane=lane):
            was = old.jobs.get(job)
            decl = new.jobs[job].spec.model(role)
            keys = keys_of(job, decl, copy, lane)
            base = base_key(decl.spec.base, wg)
            if decl.spec.lora and base not in old.states:   # the first LoRA job on it here
                keys += (base,)
            return Delta(states=keys, rebound=(job,),
                         groups=frozenset((wg, *(was.bindings.values() if was else ()))))
    return diff(old, new)


def diff(old: Snapshot, new: Snapshot) -> Delta:
    """The Delta between any two Snapshots of one cluster (placement, a job's end, ...)."""
    added, removed = (), ()
    if new.queued is not old.queued:
        before, after = {c.call: c for c in old.queued}, {c.call: c for c in new.queued}
        added = tuple(c for c in new.queued if before.get(c.call) is not c)
        removed = tuple(c for c in old.queued if after.get(c.call) is not c)
    groups: set[WorkerGroupId] = set()
    for field in ("running", "behind", "onloading", "last_job"):
        groups.update(changed_keys(getattr(old, field), getattr(new, field)))
    rebound = []
    for job in changed_keys(old.jobs, new.jobs):
        was, now = old.jobs.get(job), new.jobs.get(job)
        if was is None or now is None or was.bindings != now.bindings or was.spec != now.spec:
            groups.update(*(v.bindings.values() for v in (was, now) if v is not None))
            rebound.append(job)
        else:   # only the order of some copies moved on: those copies' groups
            groups.update(now.bindings[copy] for copy in {*was.next_seq, *now.next_seq}
                          if was.next_seq.get(copy) != now.next_seq.get(copy))
    if new.estimates is not old.estimates:   # queue-policy inputs (see ``touched``)
        jobs = {job for job, _ in changed_keys(old.estimates.service_s, new.estimates.service_s)}
        groups.update(wg for job in jobs & new.jobs.keys() for wg in new.jobs[job].bindings.values())
        nodes = {node for node, _ in changed_keys(old.estimates.bytes_per_s,
                                                  new.estimates.bytes_per_s)}
        groups.update(wg for node in nodes for wg in new.groups_on_node[node])
    return Delta(tuple(changed_keys(old.states, new.states)), added, removed,
                 frozenset(groups), tuple(rebound))


def changed_keys(a: dict, b: dict) -> list:
    """Keys added, removed or given another value object between two dicts.

    The ledger copies a dict and then sets, adds or deletes entries, so both usually list
    the same key objects in the same order: then compared pairwise by identity, in C loops
    and without hashing; otherwise by lookup.
    """
    if a is b:
        return []
    if all(map(operator.is_, a, b)):
        out = list(itertools.compress(a, map(operator.is_not, a.values(), b.values())))
        out.extend(itertools.islice(a if len(a) > len(b) else b, min(len(a), len(b)), None))
        return out
    return [k for k in dict.fromkeys((*a, *b)) if a.get(k) is not b.get(k)]


def touched(old: Snapshot, new: Snapshot, delta: Delta) -> set[WorkerGroupId]:
    """Worker groups whose planning inputs the change may have changed: the dirty groups.

    A group's plan reads its queued calls, running call, onloading call and its bound
    copies' next_seq; the States bound to it (tier, transition, version, size); the host
    memory of its nodes and the States parked there (so a State's change dirties every group
    sharing a node with the State's group). The queue policy also reads the last job served,
    the jobs' learned service times (``delta.groups``) and the learned bandwidths of the
    group's first node (changed only by a transition on a group sharing that node); the time
    is not an input here: ``QuietGroups`` keeps it apart, as the window of a quiet group.
    """
    groups = set(delta.groups)
    groups.update(c.wg for c in delta.calls_added)
    groups.update(c.wg for c in delta.calls_removed)
    for key in delta.states:
        for view in (old.states.get(key), new.states.get(key)):
            if view is not None:
                groups.update(old.neighbours[view.wg])
    return groups


def carry(old: Snapshot, new: Snapshot, delta: Delta) -> None:
    """Hand the derived values ``old`` has computed to ``new``, updated by ``delta``."""
    if new.cluster is not old.cluster or new.config is not old.config:
        return
    have, put = old.__dict__, new.__dict__
    if "quiet_groups" in have:
        put["quiet_groups"] = have["quiet_groups"].without(touched(old, new, delta))
    for name in _CLUSTER_DERIVED:
        if name in have:
            put[name] = have[name]
    if "num_bound_jobs" in have:
        put["num_bound_jobs"] = _num_bound_jobs(old, new, have["num_bound_jobs"], delta.rebound)
    if "queued_by_group" in have:
        put["queued_by_group"] = _queued_by_group(have["queued_by_group"], delta)
    if "states_by_group" in have:
        _carry_states(old, new, delta)


def _num_bound_jobs(old: Snapshot, new: Snapshot, count: dict, rebound: tuple) -> dict:
    if not rebound:
        return count
    count = dict(count)
    for job in rebound:
        for snap, sign in ((old, -1), (new, 1)):
            view = snap.jobs.get(job)
            for wg in set(view.bindings.values()) if view is not None else ():
                count[wg] += sign
    return count


def _queued_by_group(by: dict, delta: Delta) -> dict:
    if not delta.calls_added and not delta.calls_removed:
        return by
    by = dict(by)
    for call in delta.calls_removed:
        left = tuple(c for c in by.get(call.wg, ()) if c.call != call.call)
        if left:
            by[call.wg] = left
        else:
            by.pop(call.wg, None)
    for call in delta.calls_added:
        by[call.wg] = by.get(call.wg, ()) + (call,)
    return by


def _carry_states(old: Snapshot, new: Snapshot, delta: Delta) -> None:
    """States by group, then the device and host totals of the groups and nodes they touch."""
    have, put = old.__dict__, new.__dict__
    if not delta.states:
        for name in ("states_by_group", "device_state_bytes", "host_state_bytes"):
            if name in have:
                put[name] = have[name]
        return
    by, copied = dict(have["states_by_group"]), set()
    for key in delta.states:
        was, now = old.states.get(key), new.states.get(key)
        for view in (was, now):
            if view is not None and view.wg not in copied:
                by[view.wg] = dict(by.get(view.wg, {}))
                copied.add(view.wg)
        if was is not None and (now is None or now.wg != was.wg):
            del by[was.wg][key]
        if now is not None:
            by[now.wg][key] = now
    put["states_by_group"] = by
    if "device_state_bytes" in have:
        device = dict(have["device_state_bytes"])
        for wg in copied:
            device[wg] = new.device_state_bytes_of(wg)
        put["device_state_bytes"] = device
    if "host_state_bytes" in have:
        host = dict(have["host_state_bytes"])
        for node in {n for wg in copied for n in new.cluster.worker_groups[wg].nodes}:
            host[node] = new.host_state_bytes_of(node)
        put["host_state_bytes"] = host
