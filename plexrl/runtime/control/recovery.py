"""How a restarted controller picks up where it stopped: the journal, reconciled with the services.

Owns: ``recover`` -- asks every service that is still there what it holds (``holdings``:
jobs, each State's tier and version, the next call on each model copy, the calls it ran),
rebuilds each running job of this session (its ``JobRecord`` from the journal, its place in
the Snapshot from the journal's bindings, its States' tiers and versions from the services)
and replays the job's journaled calls through the controller's own admission, in sequence
order, so every call gets the same controller id and copy order as before; ``settled`` decides,
for each replayed call, whether it is over (a terminal record, or the service ran it: its
terminal record is written now, once) or must be queued again; ``resumable`` lists the jobs
a crash interrupted, with their last checkpoint. Nothing is dispatched until ``recover``
returns. Must not know: torch, what a call computes, how bytes move.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import replace

import ray

from plexrl.core import assume
from plexrl.core import events as ev
from plexrl.core.decisions import Place
from plexrl.errors import CallError
from plexrl.protocol import (Copy, Function, Role, State, Ticket, Tier, WorkerGroupId, copy_id,
                             copy_label, parse_copy_label, split_copy_id)
from plexrl.runtime.control.jobs import JobRecord, PendingCall, check_request, job_spec
from plexrl.runtime.control.journal import TERMINAL, Journal, JournaledCall

#: calls that change a weight version (journaled with the State's new version)
VERSIONED = (Function.OPTIM_STEP, Function.LOAD, Function.SYNC_WEIGHTS)


async def recover(ctl, snap) -> dict:
    """Rebuild ``ctl`` (a Controller) on ``snap`` (an empty Snapshot of its cluster) from its
    journal and its services. Returns what it found (``info()["recovered"]``)."""
    services = ctl.executor.services
    wgs = list(services)
    reports = await asyncio.gather(*(services[wg].holdings.remote() for wg in wgs),
                                   return_exceptions=True)
    held_by = {}
    for wg, report in zip(wgs, reports):
        if isinstance(report, ray.exceptions.RayActorError):
            del services[wg]
        elif isinstance(report, Exception):
            raise report
        else:
            held_by[wg] = report
    gone = set(snap.cluster.worker_groups) - set(services)
    ctl.snap = replace(snap, cluster=snap.cluster.without_groups(gone)) if gone else snap
    ctl._ids = itertools.count(ctl.journal.max_call_id() + 1)
    ctl._ran, ctl._service_next = {}, {}
    found = {"jobs": [], "ended": [], "requeued": 0, "settled": 0, "groups_gone": sorted(gone)}
    ctl._found = found
    now = time.monotonic()
    for journaled in ctl.journal.jobs("placing", "running"):
        if journaled.session != ctl.session:
            continue
        job = journaled.job
        groups = {copy_id(Role(r), *parse_copy_label(c)): WorkerGroupId(wg)
                  for (r, c), wg in ctl.journal.bindings(job).items()}
        whole = journaled.status == "running" and groups and all(
            wg in held_by and job in held_by[wg] for wg in groups.values())
        if not whole:   # still being placed, or a service of it is gone: it ends
            why = CallError(f"job {job} ended: the controller restarted while it was being "
                            "placed, or a service holding it is gone; register it again",
                            job=job)
            await asyncio.gather(*(services[wg].unbind.remote(job, why) for wg in held_by
                                   if job in held_by[wg]), return_exceptions=True)
            ctl.journal.end_job(job, str(why), status="lost" if groups else "ended")
            found["ended"].append(job)
            continue
        _restore(ctl, journaled, groups, held_by, now, found)
        found["jobs"].append(job)
    ctl._replay = {}
    return found


def _restore(ctl, journaled, groups, held_by, now: float, found: dict) -> None:
    request, job = journaled.request, journaled.job
    record = JobRecord(request, journaled.token, asyncio.get_running_loop().create_future(),
                       renewed_at=now, handed=True)
    record.placed.set_result(Ticket(job, journaled.token))
    record.groups = dict(groups)
    ctl.jobs[job] = record
    ctl._fold(ev.JobSubmitted(spec=job_spec(request, tuple(ctl.snap.group_order)), at=now))
    for key, wg in sorted(groups.items()):
        role, copy, lane = split_copy_id(key)
        ctl.snap = assume(ctl.snap, Place(job, role, copy, wg, lane=lane), now)
    states = dict(ctl.snap.states)
    for key, view in ctl.snap.states.items():
        if key.job != job or key.state == State.KV_CACHE:
            continue
        hosted = held_by[view.wg][job]
        label = copy_label(key.copy, key.lane)
        tier, version = hosted["states"][f"{key.role}/{label}/{key.state}"]
        counted = hosted["versions"].get(str(key.role))
        if counted is not None:
            version = counted.get(label, version) if key.copy == Copy.ROLLOUT \
                else counted["trainer"]
        states[key] = replace(view, tier=Tier(tier),
                              version=version if key.state == State.WEIGHTS else view.version)
    next_seq = {}
    for key, wg in groups.items():
        role, copy, lane = split_copy_id(key)
        next_seq[key] = held_by[wg][job]["next_seq"].get(f"{role}/{copy_label(copy, lane)}", 0)
    jobs = dict(ctl.snap.jobs)
    jobs[job] = replace(jobs[job], next_seq=next_seq)
    ctl.snap = replace(ctl.snap, states=states, jobs=jobs)
    ctl._service_next[job] = next_seq
    ctl._ran[job] = {seq: go for wg in set(groups.values())
                     for seq, go in held_by[wg][job]["ran"].items()}
    calls = ctl.journal.calls(job)
    ctl._replay = {(c.job, c.seq): c for c in calls}
    for known in calls:
        try:
            check_request(known.request, record)
            error = None
        except CallError as err:
            error = err
        record.held[known.seq] = PendingCall(known.request, error=error)
    before = len(ctl.calls)
    ctl._admit_calls(record)
    found["requeued"] += len(ctl.calls) - before


def settled(ctl, record: JobRecord, pending: PendingCall, known: JournaledCall) -> bool:
    """A replayed call is over if the journal ended it, or if its service ran it (its copy
    order is below the service's next): then its terminal record is written now, from the
    record the service kept. Otherwise it must be queued again (False)."""
    if known.status in TERMINAL:
        return True
    request = pending.request
    job = request.job
    if pending.copy_seq >= ctl._service_next[job].get(request.copy_id, 0):
        return False
    go = ctl._ran[job].get(request.seq)
    failed = (go or {}).get("failed", "")
    ctl.journal.finish(job, request.seq, "failed" if failed else "done",
                       failed if go else "ran before the restart; its record was evicted")
    ctl._found["settled"] += 1
    saved = (go or {}).get("saved")
    if saved:
        ctl.journal.checkpoint(job, saved["role"], saved["version"], saved["path"])
    return True


def resumable(journal: Journal) -> dict[str, dict]:
    """Jobs a crash ended (their cluster went away, or a service of theirs died) that have a
    checkpoint: job -> its status, last checkpoint version and file, and its request."""
    out = {}
    for journaled in journal.jobs("interrupted", "lost"):
        last = journal.last_checkpoint(journaled.job)
        if last is not None:
            out[journaled.job] = {"status": journaled.status, "version": last.version,
                                  "path": last.path, "request": journaled.request}
    return out
