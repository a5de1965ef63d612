"""The controller: owns the Snapshot, feeds events to ``core.plan`` on the wall clock, and
hands every decision to the one executor.

Owns: the registration of jobs (a ticket once every copy is bound, or the core's ``Reject`` as
a ``PlacementError``), admitting each job's calls in its sequence-number order whatever order
they arrive in (early ones wait in ``JobRecord.held``), the plan / assume / act loop, and
folding back what the services report (``CallFinished``, ``TransitionFinished``). It runs as
an asyncio Ray actor, so every fold and plan happens on one thread. How jobs end (leases,
``end``, a lost service, shutdown) is ``endings.py``, the core's Moves sent to the services
(one call per group and cycle) are ``moving.py``, calls sent and their finish folded are
``dispatching.py``, what may be read is ``inspection.py``,
submitted jobs are ``submissions.py`` (mixins of this class); it serves its metrics and
dashboard (``endpoints.py``, on its own loop). It decides and never carries tensors: a call's payload
and result go between the job and its service (``workers/actor.py``), never through here.

Durable (docs/design.md): what it decides is written to its journal (``journal.py``)
at fixed points -- a job registered, bound, ended; a call on arrival, BEFORE its dispatch and
at its end; a State moved; a checkpoint written. It may be restarted by Ray at any point:
its first call after a (re)start runs ``_up``, which on a restart attaches to the services
that are still there and rebuilds the Snapshot from the journal and what the services hold
(``recovery.py``) before anything is dispatched again. A service that dies ends its jobs
with ``ServiceLost`` carrying their last checkpoint.
Must not know: torch, what a call computes, how bytes move.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import secrets
import time
from pathlib import Path

import ray

from plexrl.client.job import Runtime
from plexrl.core import apply, assume, plan
from plexrl.core import events as ev
from plexrl.core.decisions import Dispatch, Move, Place, Reject
from plexrl.core.invariants import check_decisions, check_step, enforce
from plexrl.core.snapshot import Snapshot, StateView
from plexrl.errors import (AuthError, CallError, ConfigError, OrderError, PlacementError,
                           ServiceLost)
from plexrl.protocol import (BASE_OWNER, FORWARD, NEEDS, CallId, CallRequest, JobId, JobRequest,
                             State, StateKey, Ticket, Tier, WorkerGroupId, base_key, copy_id,
                             split_copy_id)
from plexrl.runtime.config import RuntimeConfig, cluster_spec
from plexrl.runtime.control import recovery
from plexrl.runtime.observe.call_log import CallLog
from plexrl.runtime.observe.endpoints import Endpoints
from plexrl.runtime.control.executor import Executor
from plexrl.runtime.control.handle_transport import HandleTransport
from plexrl.runtime.control.jobs import (JobRecord, PendingCall, check_request, job_spec,
                                         workspace_bytes)
from plexrl.runtime.control.journal import TERMINAL, Journal, state_dir
from plexrl.runtime.control.endings import JobEndings
from plexrl.runtime.control.moving import StateMoves
from plexrl.runtime.control.dispatching import CallDispatch
from plexrl.runtime.control.inspection import Inspection
from plexrl.runtime.control.submissions import SubmittedJobs
from plexrl.runtime.tinker.server import TinkerServer


class Controller(SubmittedJobs, JobEndings, StateMoves, CallDispatch, Inspection):
    # submissions.py: submitted jobs, their programs, tokens; endings.py: leases, end, a lost
    # service; moving.py: the core's Moves on the services; dispatching.py: calls sent and
    # their finish folded; inspection.py: what may be read
    def __init__(self, config: RuntimeConfig, session: str):
        self.config, self.session = config, session
        self.snap: Snapshot | None = None   # once the worker groups have their nodes
        self.jobs: dict[JobId, JobRecord] = {}
        self.calls: dict[CallId, PendingCall] = {}
        self.call_log = CallLog(config.call_log_limit)   #: finished calls, the newest
        self.executor: Executor | None = None
        self._ids = itertools.count()
        self._tasks: set[asyncio.Task] = set()
        self._last_sent: dict[WorkerGroupId, asyncio.Future] = {}   #: per group, its ``folded``
        self._wake: asyncio.TimerHandle | None = None   #: the next plan when time alone matters
        self._wake_at = math.inf
        self._failed_moves: dict[StateKey, int] = {}   #: failures in a row, per State
        self._service_init()   # submissions.py
        self.journal: Journal | None = None
        self.lost_jobs: dict[JobId, tuple[ServiceLost, str]] = {}  #: a dead service ended: error, token
        self.recovered: dict | None = None             #: what the last restart found
        self._replay: dict = {}                        #: recovery's view of the journal's calls
        self._starting: asyncio.Lock | None = None
        self.endpoints: Endpoints | None = None   #: metrics and dashboard (endpoints.py)
        self.tinker: TinkerServer | None = None   #: the Tinker API (plexrl/runtime/tinker)

    async def start(self) -> dict:
        await self._up()
        return await self.info()

    async def _up(self) -> None:
        """Start once: fresh, or -- the journal says this session's services are up -- as a
        restart, which reconciles with every service before anything is dispatched."""
        if self.snap is not None:
            return
        self._starting = self._starting or asyncio.Lock()
        async with self._starting:
            if self.snap is not None:
                return
            journal = Journal(state_dir(self.config, self.session))
            restart = journal.get("session") == self.session and journal.get("services") == "up"
            self.journal = journal
            if restart:
                self.executor = await Executor.attach(self.config, self.session)
            else:
                journal.interrupt(self.session)   # jobs of a cluster that went away
                self.executor = await Executor.start(self.config, self.session)
                journal.put("session", self.session)
                journal.put("services", "up")
            snap = Snapshot(cluster=cluster_spec(self.config, self.executor.nodes),
                            config=self.config.core_config())
            if restart:
                self._service_restore()   # submissions.py
                self.recovered = await recovery.recover(self, snap)
            else:
                self.snap = snap
            self._spawn(self._expire_leases())
            self.endpoints = await Endpoints.start(self, self.config.observe_host,
                                                   self.config.observe_port)
            self._plan()
            self.tinker = TinkerServer.start_thread(   # the Tinker API's jobs come through
                self.config.observe_host, self.config.tinker_port,   # this controller's handle
                runtime=Runtime(HandleTransport(ray.get_runtime_context().current_actor,
                                                self.config.lease_s)),
                root=Path(state_dir(self.config, self.session)) / "tinker",
                keys=self.config.tinker_api_keys, sources=self.config.tinker_models)

    async def info(self) -> dict:
        await self._up()
        return {"session": self.session, "worker_groups": sorted(self.executor.services),
                "nodes": dict(self.executor.nodes), "lease_s": self.config.lease_s,
                "journal": str(self.journal.path), "recovered": self.recovered}

    # -- what jobs ask ----------------------------------------------------------------------
    async def register(self, request: JobRequest) -> Ticket:
        await self._up()
        known = self.jobs.get(request.job)
        if known is not None and known.request == request and not known.handed:
            return await known.placed   # a registration resent after a restart
        if request.job in self.jobs:
            raise ConfigError("a job of this name is registered", field="job", value=request.job,
                              fix="end it first or choose another name")
        if str(request.job).startswith(BASE_OWNER):
            raise ConfigError(f"a job name may not start with {BASE_OWNER!r} (the runtime's "
                              "shared LoRA bases)", field="job", value=request.job,
                              fix="choose another name")
        spec = job_spec(request, tuple(self.snap.group_order))
        record = JobRecord(request, secrets.token_hex(16), asyncio.get_running_loop().create_future(),
                           renewed_at=time.monotonic())
        self.jobs[request.job] = record
        self.lost_jobs.pop(request.job, None)
        self.journal.add_job(request, record.token, self.session)
        self._fold(ev.JobSubmitted(spec=spec, at=time.monotonic()))
        self._plan()
        return await record.placed

    async def submit(self, request: CallRequest) -> None:
        """Admit a call (its payload went to its service); answers once it is queued, or with
        the error that refuses it. A call id ``(job, seq)`` the journal holds already is a
        resend (Ray resubmits what a restarted controller never answered): it is answered
        as taken if it is the same call, else refused with ``OrderError``."""
        await self._up()
        record = self._authorised(request.job, request.token)
        record.renewed_at = time.monotonic()
        record.handed = True
        if not self.journal.submitted(request):
            if self.journal.call(request.job, request.seq).request == request:
                return None
            raise OrderError(f"job {request.job}: sequence number {request.seq} was already used "
                             f"(next is {record.next_seq})", job=request.job, seq=request.seq)
        if request.seq < record.next_seq or request.seq in record.held:
            raise OrderError(f"job {request.job}: sequence number {request.seq} was already used "
                             f"(next is {record.next_seq})", job=request.job, seq=request.seq)
        try:
            check_request(request, record)
            error = None
        except CallError as err:
            error = err
        record.held[request.seq] = PendingCall(request, error=error)
        self._admit_calls(record)
        self._plan()
        if error is not None:   # it used its sequence number; the job goes on
            raise error

    async def routes(self, ticket: Ticket) -> list:
        """Where the job's calls go: (``copy_id``, service actor) for each of its copies."""
        await self._up()
        record = self._authorised(ticket.job, ticket.token)
        record.handed = True
        return [(key, self.executor.services[wg]) for key, wg in record.groups.items()]

    # -- calls in order ----------------------------------------------------------------------
    def _authorised(self, job: JobId, token: str) -> JobRecord:
        record = self.jobs.get(job)
        lost, owner = self.lost_jobs.get(job, (None, ""))
        if record is None and lost is not None and secrets.compare_digest(owner, token):
            raise lost
        if record is None or not secrets.compare_digest(record.token, token):
            raise AuthError(f"job {job}: unknown job or a token that is not this job's; use the "
                            "ticket its registration returned", job=job)
        return record

    def _admit_calls(self, record: JobRecord) -> None:
        """Queue the job's calls that are next in its order; a malformed one fails alone.

        A GENERATE for a version no SYNC_WEIGHTS of the job has installed yet is parked and
        queued right after the sync that installs it; later calls do not wait for it
        (docs/design.md D58).
        """
        while record.next_seq in record.held:
            pending = record.held.pop(record.next_seq)
            record.next_seq += 1
            request = pending.request
            try:
                if pending.error is not None:
                    raise pending.error
                group = self.snap.cluster.worker_groups.get(
                    record.groups.get(request.copy_id))
                pending.workspace_bytes = workspace_bytes(
                    record.spec(request.role), request, group.num_devices if group else 1)
                self._check_fits(request, pending.workspace_bytes, group)
                parked = record.gate(pending)
            except CallError as err:
                self._refuse(record, pending, err)
                continue
            if not parked:
                self._queue(record, pending)
                ready, stale = record.released_by(request)
                for waiting in ready:
                    self._queue(record, waiting)
                for waiting, err in stale:
                    self._refuse(record, waiting, err)

    def _check_fits(self, request, workspace: int, group) -> None:
        """A call whose reserve and States can never fit its group's device memory is a
        ``CallError`` with the sizes (it would otherwise wait for room forever)."""
        if group is None:
            return
        keys = [StateKey(request.job, request.role, request.copy, s, request.lane)
                for s in NEEDS[request.function] if s != State.KV_CACHE]
        spec = dict(self.jobs[request.job].request.models).get(request.role)
        if spec is not None and spec.lora and request.function in FORWARD:
            keys.append(base_key(spec.base, group.wg))
        held = sum(self.snap.states[k].num_bytes for k in keys if k in self.snap.states)
        budget = int(self.snap.cluster.device_budget(group.wg))
        if held + workspace > budget:
            raise CallError(
                f"job {request.job} call {request.seq} ({request.function}) needs {workspace} "
                f"bytes of device workspace beside its {held} bytes of States, more than worker "
                f"group {group.wg}'s {budget} bytes; fix: send fewer sequences or tokens per "
                "call, or give the group more device memory", job=request.job, seq=request.seq,
                function=str(request.function))

    def _refuse(self, record: JobRecord, pending: PendingCall, err: Exception) -> None:
        """A call the job cannot run: the job reads ``err`` where it sent the call."""
        request = pending.request
        known = self._replay.get((request.job, request.seq))
        if known is not None and known.status in TERMINAL:
            return   # refused before the restart
        self.journal.finish(request.job, request.seq, "refused", str(err))
        wg = record.groups.get(request.copy_id)
        if wg is not None:
            self.executor.refuse(wg, request.job, request.seq, err)

    def _queue(self, record: JobRecord, pending: PendingCall) -> None:
        request = pending.request
        known = self._replay.get((request.job, request.seq))
        pending.call = CallId(known.call if known is not None and known.call is not None
                              else next(self._ids))
        pending.queued_at = time.monotonic()
        pending.copy_seq = record.next_copy_seq(request)
        if known is not None and recovery.settled(self, record, pending, known):
            return   # it ran (or ended) before the restart: not queued again
        self.journal.queued(request.job, request.seq, pending.call, pending.copy_seq)
        self.calls[pending.call] = pending
        tokens = request.num_sequences * (request.max_tokens or request.seq_len)
        self._fold(ev.CallQueued(call=pending.call, job=request.job,
                                 seq=pending.copy_seq, function=request.function,
                                 role=request.role, at=pending.queued_at, step=request.step,
                                 num_tokens=tokens, version=request.version,
                                 workspace_bytes=pending.workspace_bytes, lane=request.lane))

    # -- plan, assume, act -------------------------------------------------------------------
    def _fold(self, event) -> None:
        before = self.snap
        self.snap = apply(self.snap, event)
        if self.config.check_invariants:
            enforce(check_step(before, self.snap))

    def _plan(self) -> None:
        while True:
            now = time.monotonic()
            decisions = plan(self.snap, now)
            if not decisions:
                return self._plan_again(now)
            if self.config.check_invariants:
                enforce(check_decisions(self.snap, decisions, now))
            moves: dict[WorkerGroupId, list[Move]] = {}
            for decision in decisions:
                self.snap = assume(self.snap, decision, now)
                if isinstance(decision, Move):
                    moves.setdefault(decision.wg, []).append(decision)
                else:
                    self._execute(decision, now)
            for batch in moves.values():   # one service call per group and cycle
                self._spawn(self._moves_done(batch))

    def _execute(self, decision, now: float) -> None:
        match decision:
            case Reject(job=job, reason=reason):
                record = self.jobs.pop(job)
                self.journal.end_job(job, reason, status="rejected")
                record.placed.set_exception(PlacementError(reason, job=job))
            case Place(job=job):
                record = self.jobs[job]
                record.groups[copy_id(decision.role, decision.copy, decision.lane)] = decision.wg
                if all(s.job != job for s in self.snap.pending):
                    self._spawn(self._bind(job, record))
            case Dispatch(call=call, wg=wg):
                self._send(call, wg, now)

    async def _bind(self, job: JobId, record: JobRecord) -> None:
        """Create the job's States on its services (on HOST, where the core put them)."""
        failed = None
        try:
            specs = dict(record.request.models)
            await asyncio.gather(*(self.executor.bind(
                wg, job, record.token, role, copy, specs[role], record.request.seed,
                self._sizes(job, role, copy, lane, wg), self._tiers(job, role, copy, lane, wg),
                lane)
                for (role, copy, lane), wg in ((split_copy_id(k), wg)
                                               for k, wg in record.groups.items())))
            if record.request.save_interval:
                where = Path(state_dir(self.config, self.session)) / "checkpoints"
                where.mkdir(parents=True, exist_ok=True)
                await asyncio.gather(*(self.executor.services[wg].checkpoints.remote(
                    job, record.request.save_interval, str(where))
                    for wg in set(record.groups.values())))
        except Exception as err:   # a service refused: nothing of the job stays behind
            failed = err
        if self.jobs.get(job) is not record:   # ended while binding (endings.py)
            return await self._unbind_again(job, record)
        if failed is not None:
            await self._end_job(job, record, failed)
            return
        record.renewed_at = time.monotonic()   # the lease runs from when the driver can renew
        self.journal.bind(job, record.groups)
        for key, view in self.snap.states.items():
            if key.job == job:
                self.journal.state(key, view.tier, view.version)
        record.placed.set_result(Ticket(job, record.token))

    def _held(self, job: JobId, role, copy, lane: int, wg) -> dict[State, StateView]:
        """The core's view of each State of a copy, and of a LoRA model's base on ``wg``."""
        keys = {s: StateKey(job, role, copy, s, lane) for s in State}
        spec = dict(self.jobs[job].request.models)[role]
        if spec.lora:
            keys[State.BASE] = base_key(spec.base, wg)
        return {s: self.snap.states[k] for s, k in keys.items() if k in self.snap.states}

    def _tiers(self, job: JobId, role, copy, lane: int, wg) -> dict[State, Tier]:
        """Where the core put each State at placement (HOST, or DISK when host is short)."""
        return {s: v.tier for s, v in self._held(job, role, copy, lane, wg).items()}

    def _sizes(self, job: JobId, role, copy, lane: int, wg) -> dict[State, int]:
        """The bytes the core counts for each State of a copy (the service must agree)."""
        return {s: v.num_bytes for s, v in self._held(job, role, copy, lane, wg).items()}

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
