"""How a job ends, a mixin of the controller: leases its driver renews (and their expiry),
``end`` from its driver, and a worker group whose service actor died.

Owns: ``shutdown`` (every job ends), ``renew``, ``_expire_leases``, ``end``, ``lost``,
``_end_job``, ``_unbind_again`` (an end that landed during binding), ``_lost``, ``_forget``.
Every ending releases the job's States on its services, records the end in the journal and
folds ``JobEnded`` (or ``WorkerLost``) into the Snapshot; other jobs go on. Uses the
controller's ``jobs``, ``calls``, ``journal``, ``executor``, ``_fold``, ``_plan``,
``_authorised``. Must not know: scheduling, torch, what a call computes.
"""

from __future__ import annotations

import asyncio
import secrets
import shutil
import time
from dataclasses import replace

import ray

from plexrl.core import events as ev
from plexrl.errors import CallError, LeaseExpired, ServiceLost
from plexrl.protocol import JobId, Ticket
from plexrl.runtime.control.jobs import JobRecord
from plexrl.runtime.control.journal import state_dir


class JobEndings:
    async def shutdown(self) -> None:
        await self._up()
        for job, record in list(self.jobs.items()):
            await self._end_job(job, record, CallError(f"runtime shut down; job {job} ended",
                                                       job=job))
        if self.endpoints is not None:
            await self.endpoints.stop()
        if self.tinker is not None:
            await asyncio.get_running_loop().run_in_executor(None, self.tinker.stop_thread)
            self.tinker.runtime.close()
        await self.executor.shutdown()
        self.journal.put("services", "down")
        self.journal.close()
        if not self.config.state_dir:   # a session's own journal: nothing left to resume
            shutil.rmtree(state_dir(self.config, self.session), ignore_errors=True)

    async def renew(self, tickets: list[Ticket]) -> None:
        """The drivers of these jobs are alive (their transports call this every lease / 3)."""
        await self._up()
        now = time.monotonic()
        for ticket in tickets:
            record = self.jobs.get(ticket.job)
            if record is not None and secrets.compare_digest(record.token, ticket.token):
                record.renewed_at = now

    async def _expire_leases(self) -> None:
        """End every job whose driver has been silent for ``lease_s``: its calls fail, its
        States, spill files and bindings are released; other jobs go on."""
        lease = self.config.lease_s
        while True:
            await asyncio.sleep(min(1.0, lease / 4))
            now = time.monotonic()
            for job, record in list(self.jobs.items()):
                if now - record.renewed_at > lease and record.placed.done():
                    await self._end_job(job, record, LeaseExpired(
                        f"job {job}: its driver sent no sign of life for {lease:g} s; the job "
                        "was ended and its state released (fix: keep the driver's transport "
                        "open, or raise lease_s)", job=job, lease_s=lease))

    async def end(self, ticket: Ticket) -> None:
        await self._up()
        if ticket.job not in self.jobs and ticket.job in self.lost_jobs:
            return None   # ended already, by its service's death
        record = self._authorised(ticket.job, ticket.token)
        await self._end_job(ticket.job, record, CallError(f"job {ticket.job} ended",
                                                          job=ticket.job))

    async def lost(self, ticket: Ticket) -> ServiceLost | None:
        """The ``ServiceLost`` that ended this job, if a service of it died (each of its
        services is asked; the first found dead ends its jobs now); else None."""
        await self._up()
        record = self.jobs.get(ticket.job)
        if record is not None and secrets.compare_digest(record.token, ticket.token):
            for wg in sorted(set(record.groups.values())):
                rank = await self.executor.dead_rank(wg) if wg in self.executor.services \
                    else None
                if rank is not None:
                    self._lost(wg, ServiceLost(f"rank {rank} died"), rank)
                    break
        err, token = self.lost_jobs.get(ticket.job, (None, ""))
        return err if err is not None and secrets.compare_digest(token, ticket.token) else None

    async def _end_job(self, job: JobId, record: JobRecord, err: Exception) -> None:
        """Forget the job: its calls still waiting fail with ``err``; its States are released;
        a registration still waiting for its placement gets ``err``."""
        self._forget(job)
        if not record.placed.done():
            record.placed.set_exception(err)
        self.journal.end_job(job, f"{type(err).__name__}: {err}")
        self._fold(ev.JobEnded(job=job, at=time.monotonic(), reason=str(err)))
        await asyncio.gather(*(self.executor.unbind(wg, job, err)
                               for wg in set(record.groups.values())), return_exceptions=True)
        self._plan()

    async def _unbind_again(self, job: JobId, record: JobRecord) -> None:
        """The job ended while its binds were in flight (a cancel, a lease, a lost service):
        the unbind its end sent may have run before a bind on the service's other thread,
        which then left that copy's States. Unbind once more on its live groups."""
        ended = CallError(f"job {job} ended while it was being placed", job=job)
        groups = set(record.groups.values()) & set(self.executor.services)
        await asyncio.gather(*(self.executor.unbind(wg, job, ended) for wg in groups),
                             return_exceptions=True)

    def _lost(self, wg, err: Exception, rank: int = -1) -> None:
        """A service died, or one rank of its group (``rank``; -1: not known): its jobs end
        with ``ServiceLost``, naming the rank and their last checkpoint (their calls there
        fail, and the job reads that error from ``lost``); the group leaves the cluster the
        core places on; other groups go on."""
        if wg not in self.executor.services:
            return   # known already
        del self.executor.services[wg]
        world = len(self.executor.ranks.get(wg, ())) or 1
        what = f"rank {rank} of its {world} ranks" if rank >= 0 and world > 1 else \
            "its service actor"
        for job, record in list(self.jobs.items()):
            if wg in record.groups.values():
                self._forget(job)
                last = self.journal.last_checkpoint(job)
                lost = ServiceLost(
                    f"worker group {wg} lost {what} ({type(err).__name__}); job {job} "
                    "must resume from its last saved state: "
                    + (f"version {last.version} at {last.path}" if last else "none was saved"),
                    wg=wg, job=job, last_version=last.version if last else -1,
                    checkpoint=last.path if last else "", rank=rank)
                self.lost_jobs[job] = (lost, record.token)
                if not record.placed.done():
                    record.placed.set_exception(lost)
                self.journal.end_job(job, str(lost), status="lost")
                alive = set(record.groups.values()) - ({wg} if rank <= 0 else set())
                for group in alive:   # a lead whose rank died fails the job's calls waiting
                    self.executor.unbind(group, job, lost)
        self._fold(ev.WorkerLost(wg=wg, at=time.monotonic()))
        self.snap = replace(self.snap, cluster=self.snap.cluster.without_groups({wg}))
        self._plan()

    def _forget(self, job: JobId) -> None:
        self.jobs.pop(job, None)
        self.calls = {c: p for c, p in self.calls.items() if p.request.job != job}
