"""The asyncio shell of a service actor: where a job's call meets the controller's go.

Owns: the rendezvous of each call, keyed by (job, sequence number). The job's client sends
the call with its payload straight to the service of its worker group (``run``); the
controller, when the core dispatches the call, sends ``go`` with the call's place in its
job's order. The call runs once both have arrived, and its result goes back to the job
directly: neither its payload nor its result ever passes through the controller, which
gets a small record (``go``'s answer) to fold. Calls compute on one thread and transitions
copy on another, so prefetch overlaps the running call. The service (and so torch) is
imported in this actor's process only; the controller that starts it never imports torch.
A service remembers the outcome of its recent calls (``recent.py``): a call id ``(job, seq)``
that comes again -- the client resending its call, or a restarted controller sending its go
again -- is answered from that record and never runs twice. ``holdings`` tells a restarted
controller what this service holds (jobs, States and their tiers, versions, which calls ran)
once every call and transition already started here has finished. ``engine="simulated"``
hosts ``plexrl.runtime.workers.simulated.SimulatedService`` instead (no torch) behind this shell.

A worker group of n devices is n of these actors, one per rank, joined in one
``torch.distributed`` process group (``endpoint``/``join``). Rank 0, the lead, is the group's
service for everyone else: it fans every bind, move, checkpoint and call out to the other ranks
(``rank_run``), runs its own share, and joins the ranks' answers into one (``ranks.py``). The
calls of a group go to the ranks in the lead's order, one at a time, so every rank enters the
same collectives in the same order. A rank that dies makes every call of the group fail with
``ServiceLost`` naming it (``lost_rank``), from then on.
Must not know: scheduling, or what a call computes.
"""

from __future__ import annotations

import asyncio
import socket
import time
from concurrent.futures import ThreadPoolExecutor

import ray

from plexrl.errors import ServiceLost
from plexrl.protocol import Function
from plexrl.runtime.workers.cores import pin_thread
from plexrl.runtime.workers.ranks import cause, joined, merged_move, raise_first
from plexrl.runtime.workers.recent import CallRecords, Outcome


class _Rendezvous:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.payload: asyncio.Future = loop.create_future()   #: set when the job's call arrives
        self.result: asyncio.Future = loop.create_future()    #: set when it ran (or failed)
        self.record: asyncio.Future = loop.create_future()    #: what ``go`` answers, once ran
        #: set once it is handed to the compute thread, or once it never will be
        self.handed: asyncio.Future = loop.create_future()
        self.started = False                                  #: a go is running it
        self.waiters = 0                                      #: ``run`` calls awaiting it


class ServiceActor:
    def __init__(self, *args, engine: str = "torch", recent_calls: int = 256,
                 call_s: float = 0.0, cores: tuple[int, ...] = (), rank: int = 0,
                 world: int = 1):
        if engine == "simulated":
            from plexrl.runtime.workers.simulated import SimulatedService
            self._service = SimulatedService(*args, call_s=call_s)
        else:
            from plexrl.runtime.workers.service import Service
            self._service = Service(*args, rank=rank, world=world)
        self.wg, self.rank, self.world = str(args[0]), rank, world
        self._peers: list = []            #: the lead's view of ranks 1..n-1, in rank order
        self._dead_rank: int | None = None   #: the first rank found dead (then every call fails)
        self._compute = ThreadPoolExecutor(1, thread_name_prefix="compute",
                                           initializer=pin_thread, initargs=(cores,))
        self._copy = ThreadPoolExecutor(1, thread_name_prefix="copy")
        self._calls: dict[tuple[str, int], _Rendezvous] = {}
        self.records = CallRecords(recent_calls)
        self._checkpoints: dict[str, tuple[int, str]] = {}   #: job -> (every N versions, dir)
        self._bound: set[str] = set()                         #: jobs with States here

    async def ping(self) -> bool:
        """Alive (answers at once, whatever runs)."""
        return True

    async def ready(self) -> dict:
        return await self._on(self._compute, self._service.ready)

    # -- the ranks of a group of several devices ---------------------------------------------
    async def endpoint(self) -> str:
        """Where the group's ranks meet to join their process group: this node, a free port."""
        with socket.socket() as probe:
            probe.bind(("", 0))
            port = probe.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    async def join(self, address: str) -> None:
        """Join the group's process group at ``address`` (every rank at once)."""
        from plexrl.runtime.workers.sharded import join_group
        await self._on(self._compute, join_group, address, self.rank, self.world)

    async def set_peers(self, peers: list) -> None:
        """The lead learns the other ranks' actors, in rank order."""
        self._peers = list(peers)

    async def lost_rank(self) -> int | None:
        """The rank of this group found dead, if one was (at once, whatever runs)."""
        return self._dead_rank

    async def _everywhere(self, method: str, *args) -> list:
        """``method`` on the other ranks (empty on a rank that is not a lead); a dead rank is
        remembered and its answer is the ``ServiceLost`` naming it."""
        answers = await asyncio.gather(*(getattr(p, method).remote(*args) for p in self._peers),
                                       return_exceptions=True)
        return [self._lost(rank, a) if isinstance(a, ray.exceptions.RayActorError) else a
                for rank, a in enumerate(answers, 1)]

    def _lost(self, rank: int, err: Exception | None = None) -> ServiceLost:
        if self._dead_rank is None:
            self._dead_rank = rank
        return ServiceLost(f"worker group {self.wg}: rank {self._dead_rank} of its {self.world} "
                           f"ranks died ({type(err).__name__ if err else 'found dead before'}); "
                           "its jobs cannot run here", wg=self.wg, rank=self._dead_rank)

    async def bind(self, job: str, *args) -> None:
        here = self._on(self._compute, self._service.bind, job, *args)
        answers = await asyncio.gather(here, self._everywhere("bind", job, *args))
        raise_first(answers[1])
        self._bound.add(job)

    async def unbind(self, job: str, err: Exception) -> None:
        """Forget a job: its calls still waiting here fail with ``err``."""
        self._bound.discard(job)
        for (owner, _), slot in list(self._calls.items()):
            if owner != job:
                continue
            if not slot.result.done():
                slot.result.set_exception(err)
            _resolve(slot.handed)
        await asyncio.gather(self._on(self._compute, self._service.unbind, job),
                             self._everywhere("unbind", job, err))
        self.records.forget(job)
        self._checkpoints.pop(job, None)

    # -- calls -------------------------------------------------------------------------------
    async def run(self, request, payload):
        """A job's call: waits for the controller's go, then answers the job with its result.
        A call id seen before is answered from the service's record (or waits for the run
        already under way): a resent call never runs twice. Once a rank of the group died,
        every call is a ``ServiceLost`` naming it."""
        if self._dead_rank is not None:
            raise self._lost(self._dead_rank)
        self._service.check_token(request)
        done = self.records.get(request.job, request.seq)
        if done is not None:
            return _answer(done)
        slot = self._slot(request.job, request.seq)
        if not slot.payload.done():
            slot.payload.set_result(payload)
        slot.waiters += 1
        try:
            return await asyncio.shield(slot.result)
        finally:
            slot.waiters -= 1
            if slot.waiters == 0 and slot.record.done():
                self._calls.pop((request.job, request.seq), None)

    async def go(self, order) -> dict:
        """The controller dispatched ``order``: run it once its payload is here. A go for a
        call that ran (or runs) already answers that run's record."""
        request = order.request
        done = self.records.get(request.job, request.seq)
        if done is not None and done.record is not None:
            return done.record
        slot = self._slot(request.job, request.seq)
        if slot.started:
            return await asyncio.shield(slot.record)
        slot.started = True
        payload = await slot.payload
        if order.after is not None:   # sent behind that call: it goes to the compute thread first
            await self._handed(*order.after)
        self.records.executed(request.job, request.seq)
        began = []   # when the compute thread takes it up (a call sent behind another waits)

        def run():
            began.append(time.perf_counter())
            return self._run(order, payload)
        running = asyncio.get_running_loop().run_in_executor(self._compute, run)
        _resolve(slot.handed)   # in line on the compute thread, which runs calls in turn
        try:
            result, saved = await running
        except Exception as err:   # the job reads it from its result; the controller goes on
            record = {"duration_s": _since(began), "failed": type(err).__name__}
            if self._dead_rank is not None:
                record["lost_rank"] = self._dead_rank
            self._settle(slot, request, Outcome(error=err, record=record))
            return record
        record = {"duration_s": _since(began), "failed": "", "saved": saved}
        self._settle(slot, request, Outcome(result=result, record=record))
        return record

    def _run(self, order, payload):
        """Run the call on every rank (the other ranks first, each on its compute thread) and
        join their rows; a rank found dead makes it a ``ServiceLost``."""
        if self._dead_rank is not None:
            raise self._lost(self._dead_rank)
        if order.source is not None:   # the trainer copy is on another group: its weights
            request = order.request
            payload = {**(payload or {}), "trainer_weights":
                       order.source.whole_weights.remote(request.job, request.role)}
        running = [peer.rank_run.remote(order, payload) for peer in self._peers]
        try:
            result, saved = self._run_here(order, payload)
        except Exception:
            self._answers(running)   # a dead rank, not this rank's error, is what happened
            raise
        return joined(order.request.function, result, self._answers(running)), saved

    def _answers(self, running: list) -> list:
        """The other ranks' results, in rank order; any rank's error is raised (a dead rank's
        as ``ServiceLost``) once all have answered, so the ranks stay in step."""
        answers, failure = [], None
        for rank, ref in enumerate(running, 1):
            try:
                answers.append(ref.future().result()[0])   # on the compute thread
            except ray.exceptions.RayActorError as err:
                failure = self._lost(rank, err)
            except Exception as err:   # noqa: BLE001 -- raised below, after the others
                failure = failure or cause(err)
        if failure is not None:
            raise failure
        return answers

    async def rank_run(self, order, payload):
        """The lead's call, on this rank: its share of the rows, its shard of the States."""
        return await self._on(self._compute, self._run_here, order, payload)

    def _run_here(self, order, payload):
        """Run the call; after an OPTIM_STEP that makes a version the job checkpoints at,
        write the checkpoint before any other call of this group runs."""
        request = order.request
        if isinstance((payload or {}).get("trainer_weights"), ray.ObjectRef):
            payload = {**payload, "trainer_weights": payload["trainer_weights"].future().result()}
        result = self._service.run(order, payload)
        saved = None
        if request.function == Function.SAVE:
            saved = {"role": str(request.role), "path": str(request.option("path")),
                     "version": int(result.get("optim_steps", 0))}
        every, where = self._checkpoints.get(request.job, (0, ""))
        if request.function == Function.OPTIM_STEP and every:
            version = int(result.get("version", 0))
            if version % every == 0:
                path = f"{where}/{request.job}-{request.role}-v{version}.safetensors"
                self._service.checkpoint(request.job, request.role, path)
                saved = {"role": str(request.role), "path": path, "version": version}
        return result, saved

    async def _handed(self, job: str, seq: int) -> None:
        """Until call ``seq`` of ``job`` is in line on the compute thread (at once if it ran,
        or if its job is gone from here)."""
        if job in self._bound and self.records.get(job, seq) is None:
            await asyncio.shield(self._slot(job, seq).handed)

    def _settle(self, slot: _Rendezvous, request, outcome: Outcome) -> None:
        _resolve(slot.handed)
        self.records.finished(request, outcome)
        if not slot.result.done():
            if outcome.error is not None:
                slot.result.set_exception(outcome.error)
            else:
                slot.result.set_result(outcome.result)
        if not slot.record.done():
            slot.record.set_result(outcome.record)
        if slot.waiters == 0:
            self._calls.pop((request.job, request.seq), None)

    async def checkpoints(self, job: str, every: int, where: str) -> None:
        """Write a checkpoint of ``job``'s trainer copies to ``where`` every ``every``
        weight versions (0: never)."""
        if every:
            self._checkpoints[job] = (every, where)
        raise_first(await self._everywhere("checkpoints", job, every, where))

    async def fail(self, job: str, seq: int, err: Exception) -> None:
        """The controller refused the call: its job gets ``err``."""
        slot = self._slot(job, seq)
        if not slot.result.done():
            slot.result.set_exception(err)
            slot.result.exception()   # read: a refusal nobody waits for is not an error
        if not slot.record.done():
            slot.record.set_result(None)
        _resolve(slot.handed)

    async def whole_weights(self, job: str, role) -> object:
        """A trainer copy's whole weights, for a SYNC_WEIGHTS on another group: gathered on
        the copy thread of every rank (the compute thread may be running a call, or waiting
        on another group)."""
        here = self._on(self._copy, self._service.whole_weights, job, role)
        answers = await asyncio.gather(here, self._everywhere("whole_weights", job, role))
        raise_first(answers[1])
        return answers[0]

    # -- transitions and records -------------------------------------------------------------
    async def moves(self, batch: list[tuple]) -> list:
        """Moves the controller decided together, one after another on the copy thread; each
        answers its record, or the error it raised (the others still run)."""
        def run() -> list:
            out = []
            for args in batch:
                try:
                    out.append(self._service.move(*args))
                except Exception as err:   # noqa: BLE001 -- answered per move
                    out.append(err)
            return out
        here, there = await asyncio.gather(self._on(self._copy, run),
                                           self._everywhere("moves", batch))
        return [merged_move([mine] + [t if isinstance(t, Exception) else t[i] for t in there])
                for i, mine in enumerate(here)]

    async def transitions(self, failed: bool = False, start: int = 0) -> list[dict]:
        return self._service.transitions(failed, start)

    async def stats(self) -> dict:
        """This service's bytes per tier; a lead's sums its ranks' (and lists each rank's)."""
        mine = self._service.stats()
        if not self._peers:
            return mine
        ranks = [mine] + [s for s in await self._everywhere("stats") if isinstance(s, dict)]
        summed = {k: sum(r[k] for r in ranks) if isinstance(v, int) and k != "num_states" else v
                  for k, v in mine.items()}
        return {**summed, "ranks": ranks}

    async def holdings(self) -> dict:
        """What this service holds, once every call and transition already started here has
        finished (a barrier on both threads): per job, its States (tier, version), the next
        call on each model copy, and the calls it ran recently with their records."""
        await self._on(self._copy, lambda: None)
        while any(slot.started and not slot.record.done() for slot in self._calls.values()
                  if slot.payload.done()):
            await asyncio.sleep(0.01)
        await self._on(self._compute, lambda: None)
        held = await self._on(self._compute, self._service.holdings)
        for job, hosted in held.items():
            hosted["ran"] = self.records.of_job(job)
            hosted["versions"] = {role: v for (owner, role), v in self.records.versions.items()
                                  if owner == job}
        return held

    async def executions(self) -> dict:
        """How many times calls really ran: the total, and the call ids that ran twice."""
        return {"total": sum(self.records.executions.values()),
                "repeated": self.records.repeated()}

    async def close(self) -> None:
        await asyncio.gather(self._on(self._compute, self._service.close),
                             self._everywhere("close"))

    def _slot(self, job: str, seq: int) -> _Rendezvous:
        key = (job, seq)
        if key not in self._calls:
            self._calls[key] = _Rendezvous(asyncio.get_running_loop())
        return self._calls[key]

    @staticmethod
    async def _on(pool: ThreadPoolExecutor, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)


def _answer(outcome: Outcome):
    if outcome.error is not None:
        raise outcome.error
    return outcome.result


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


def _since(began: list) -> float:
    now = time.perf_counter()
    return now - began[0] if began else 0.0
