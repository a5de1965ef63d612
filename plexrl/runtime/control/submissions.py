"""The controller as a team's service: submitted jobs, their programs, and who may see them.

Owns: the operator token (its digest; ``serve`` sets it once), submitting a job file's
``Submission`` (the job enters the core like a registration, waits in ``snap.pending`` while
it finds no room, and its program starts as a child process once every copy is bound),
``attach`` (the program, or any driver holding the job's ticket, takes over the job),
listing jobs with their queue position and reason, reading a job's log, cancelling a job, and
the rule of who may do what: the operator token sees and cancels every job, a job's token
only its own. While a submitted job's program runs, the controller renews its lease; when
the program exits, the job ends and its States are released.

It is a mixin of ``Controller`` (controller.py), kept apart so the controller's own file
only gains a base class and one line of ``__init__``. Must not know: torch, what a call
computes, how bytes move, how the CLI prints.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from plexrl.core import events as ev
from plexrl.core.usage import host_room
from plexrl.errors import AuthError, CallError, ConfigError, PlacementError
from plexrl.protocol import JobId, JobRequest, Ticket
from plexrl.runtime.control.jobs import JobRecord, job_spec
from plexrl.runtime.submitted.jobspec import Submission
from plexrl.runtime.submitted.supervisor import ChildProcess

FINAL = ("succeeded", "failed", "cancelled", "rejected")
KILL_GRACE_S = 5.0
LOG_CHUNK = 1 << 20   #: bytes one ``job_log`` answer carries at most


@dataclass
class SubmittedJob:
    """A submitted job from ``submit`` until its program's exit status is known."""

    submission: Submission
    token: str
    order: int                           #: submission order, from 0
    log_path: Path
    state: str = "queued"                #: queued, starting, running, or one of FINAL
    reason: str = ""
    submitted_at: float = field(default_factory=time.time)   #: wall clock s
    started_at: float | None = None
    ended_at: float | None = None
    exit_code: int | None = None
    child: ChildProcess | None = None

    def finish(self, state: str, reason: str) -> None:
        if self.state not in FINAL:
            self.state, self.reason, self.ended_at = state, reason, time.time()


class SubmittedJobs:
    """Mixin of ``Controller``: ``serve``, ``submit_job``, ``attach``, ``list_jobs``,
    ``job_log``, ``cancel_job``, ``service_status``."""

    def _service_init(self) -> None:
        self.submitted: dict[JobId, SubmittedJob] = {}
        self._operator: bytes | None = None      #: sha256 of the operator token
        self._served: dict = {}                  #: run dir, address, controller name
        self._orders = 0

    # -- set-up and who is asking -------------------------------------------------------------
    async def serve(self, operator_token: str, run_dir: str, address: str, name: str) -> dict:
        """Make this controller a team's service (``plexrl up`` calls it once): the operator
        token, where job logs go, and what a job's program needs to attach."""
        digest = hashlib.sha256(operator_token.encode()).digest()
        if self._operator is not None and not secrets.compare_digest(self._operator, digest):
            raise AuthError("this controller already serves with another operator token")
        self._operator = digest
        self._served = {"run_dir": run_dir, "address": address, "name": name}
        await self._up()   # the journal keeps both, so a restarted controller still serves
        self.journal.put("operator", digest.hex())
        self.journal.put("served", json.dumps(self._served))
        Path(run_dir, "logs").mkdir(mode=0o700, parents=True, exist_ok=True)   # owner only
        return await self.info()

    def _service_restore(self) -> None:
        """After a controller restart: the operator token and serving details ``serve`` set.
        (Programs it started keep running; the restarted controller no longer lists them.)"""
        digest = self.journal.get("operator")
        if digest is not None:
            self._operator = bytes.fromhex(digest)
            self._served = json.loads(self.journal.get("served", "{}"))

    def _is_operator(self, token: str) -> bool:
        return self._operator is not None and secrets.compare_digest(
            self._operator, hashlib.sha256((token or "").encode()).digest())

    def _owner_of(self, token: str) -> JobId | None:
        """The job ``token`` belongs to (a submitted or a registered one), else None."""
        for job, sub in self.submitted.items():
            if secrets.compare_digest(sub.token, token or ""):
                return job
        for job, record in self.jobs.items():
            if secrets.compare_digest(record.token, token or ""):
                return job
        return None

    def _visible(self, token: str, job: JobId | None = None) -> set[JobId] | None:
        """The jobs ``token`` may see (None: all, the operator); an AuthError for a token
        that is neither the operator's nor ``job``'s."""
        if self._is_operator(token):
            return None
        owner = self._owner_of(token)
        if owner is None or (job is not None and owner != job):
            raise AuthError(f"job {job or '*'}: this needs the operator token (written by "
                            "`plexrl up` to its run directory) or the job's own token",
                            job=job or "")
        return {owner}

    # -- submit, attach ----------------------------------------------------------------------
    async def submit_job(self, submission: Submission, token: str) -> Ticket:
        """Queue a job file's job; its program starts once it is placed. Refusals (a name in
        use, resources no worker group has) are ConfigErrors and leave nothing behind."""
        if not self._is_operator(token):
            raise AuthError("submitting a job needs the operator token; fix: run on the "
                            "machine `plexrl up` ran on, or pass --token")
        request = submission.request
        job = request.job
        self._check_resources(submission)
        old = self.submitted.get(job)
        if job in self.jobs or (old is not None and old.state not in FINAL):
            raise ConfigError("a job of this name is queued or running", file=submission.source_file,
                              field="name", value=job, fix="cancel it first or choose another name")
        spec = job_spec(request, tuple(self.snap.group_order))
        record = JobRecord(request, secrets.token_hex(16),
                           asyncio.get_running_loop().create_future(), renewed_at=time.monotonic())
        log_path = Path(self._served["run_dir"], "logs", f"{job}.log")
        self.submitted[job] = SubmittedJob(submission, record.token, self._orders, log_path)
        self._orders += 1
        self.jobs[job] = record
        self.lost_jobs.pop(job, None)
        self.journal.add_job(request, record.token, self.session)   # as register does
        self._fold(ev.JobSubmitted(spec=spec, at=time.monotonic()))
        self._plan()
        self._spawn(self._supervise(job, record))
        return Ticket(job, record.token)

    def _check_resources(self, submission: Submission) -> None:
        """A job whose declared resources no worker group has could never start."""
        groups = self.config.worker_groups
        most = max(g.num_devices for g in groups)
        where = submission.source_file
        for role, size in submission.device_bytes:
            if size > self.config.device_bytes:
                raise ConfigError("no device of this runtime has that much memory", file=where,
                                  field=f"models.{role}.resources.device_bytes", value=size,
                                  fix=f"ask for at most {self.config.device_bytes} bytes "
                                  "(plexrl up --device-bytes sets it)")
        for role, devices in submission.devices:
            if devices > most:
                raise ConfigError("no worker group has that many devices", file=where,
                                  field=f"models.{role}.resources.devices", value=devices,
                                  fix=f"ask for at most {most} (plexrl up --devices sets it)")

    async def attach(self, ticket: Ticket) -> JobRequest:
        """The job's registration, once it is placed, for a driver holding its ticket (a
        submitted job's program attaches with the ticket in its environment)."""
        record = self._authorised(ticket.job, ticket.token)
        await asyncio.shield(record.placed)
        record.renewed_at = time.monotonic()
        return record.request

    async def _supervise(self, job: JobId, record: JobRecord) -> None:
        """Wait for placement, run the program, renew the lease while it runs, end the job
        when it exits."""
        sub = self.submitted[job]
        try:
            await asyncio.shield(record.placed)
        except Exception as err:
            sub.finish("rejected" if isinstance(err, PlacementError) else "failed", str(err))
            return
        if sub.state in FINAL:     # cancelled while its States were being bound
            return
        sub.state = "starting"
        served = self._served
        env = dict(sub.submission.env) | {
            "PLEXRL_ADDRESS": served["address"], "PLEXRL_CONTROLLER": served["name"],
            "PLEXRL_JOB": job, "PLEXRL_JOB_TOKEN": record.token,
            "PLEXRL_SAVE_INTERVAL": str(sub.submission.save_interval)}
        try:
            argv = [sys.executable if a == "{python}" else a for a in sub.submission.argv]
            sub.child = await ChildProcess.start(argv, cwd=sub.submission.cwd,
                                                 env=env, log_path=sub.log_path)
        except OSError as err:
            sub.finish("failed", f"its program could not start: {err}")
            await self._end_job(job, record, CallError(f"job {job}: {sub.reason}", job=job))
            return
        sub.state, sub.started_at = "running", time.time()
        lease = self.config.lease_s
        while (code := await sub.child.wait(lease / 3)) is None:
            record.renewed_at = time.monotonic()    # the program is the job's driver
        sub.exit_code = code
        sub.finish("succeeded" if code == 0 else "failed", f"its program exited with status {code}")
        if self.jobs.get(job) is record:
            await self._end_job(job, record, CallError(f"job {job}: its program exited "
                                                       f"(status {code})", job=job))

    # -- read --------------------------------------------------------------------------------
    async def list_jobs(self, token: str) -> list[dict]:
        """Every job the token may see, in submission order; a queued one with its position
        (1 is admitted next) and the reason it waits."""
        visible = self._visible(token)
        positions = self._queue_positions()
        out = []
        for job, sub in sorted(self.submitted.items(), key=lambda kv: kv[1].order):
            if visible is None or job in visible:
                out.append(self._view(job, sub, positions))
        for job, record in self.jobs.items():   # drivers that registered themselves
            if job not in self.submitted and (visible is None or job in visible):
                out.append({"job": job, "state": "attached", "priority": record.request.priority,
                            "reason": "registered by its own driver", "position": None,
                            "worker_groups": sorted(set(record.groups.values()))})
        return out

    def _view(self, job: JobId, sub: SubmittedJob, positions: dict[JobId, int]) -> dict:
        record = self.jobs.get(job)
        view = {"job": job, "state": sub.state, "priority": sub.submission.request.priority,
                "position": positions.get(job), "reason": sub.reason,
                "submitted_at": sub.submitted_at, "started_at": sub.started_at,
                "ended_at": sub.ended_at, "exit_code": sub.exit_code,
                "pid": sub.child.pid if sub.child else None, "log": str(sub.log_path),
                "worker_groups": sorted(set(record.groups.values())) if record else []}
        if job in positions:
            view["reason"] = self._wait_reason(job)
        return view

    def _queue_positions(self) -> dict[JobId, int]:
        """1-based places in the admission queue, in the order the core admits (priority,
        then first come: ``core.allocation.admit_pending``)."""
        order = sorted(self.snap.pending, key=lambda s: -s.priority)
        return {spec.job: i + 1 for i, spec in enumerate(order)}

    def _wait_reason(self, job: JobId) -> str:
        free = {wg: host_room(self.snap, wg) for wg in self.snap.group_order}
        ahead = [s.job for s in sorted(self.snap.pending, key=lambda s: -s.priority)]
        ahead = ahead[:ahead.index(job)]
        why = ("no room: the host-pinned states of its models do not fit the free host memory "
               f"of any worker group (free bytes: {free}); it starts when a job ends")
        return why + (f"; ahead of it: {', '.join(ahead)}" if ahead else "")

    async def job_log(self, job: JobId, token: str, offset: int = 0) -> dict:
        """Up to 1 MiB of the job's log from byte ``offset``; ``done`` once nothing more can
        come (the program exited, or the job ended before it started)."""
        self._visible(token, job)
        sub = self.submitted.get(job)
        if sub is None:
            raise ConfigError("no submitted job of this name", field="job", value=job,
                              fix="see `plexrl jobs`")
        done = sub.state in FINAL
        text = b""
        if sub.log_path.exists():
            with open(sub.log_path, "rb") as log:
                log.seek(offset)
                text = log.read(LOG_CHUNK)
        return {"job": job, "text": text.decode(errors="replace"), "offset": offset + len(text),
                "done": done and len(text) < LOG_CHUNK, "state": sub.state}

    async def service_status(self, token: str) -> dict:
        """The controller and the jobs the token may see, counted by state, with the queue."""
        jobs = await self.list_jobs(token)
        counts: dict[str, int] = {}
        for job in jobs:
            counts[job["state"]] = counts.get(job["state"], 0) + 1
        queue = sorted((j for j in jobs if j["position"] is not None), key=lambda j: j["position"])
        return {**(await self.info()), "controller": self._served.get("name"),
                "address": self._served.get("address"), "jobs": counts,
                "queue": [{k: j[k] for k in ("job", "position", "priority", "reason")}
                          for j in queue]}

    # -- cancel ------------------------------------------------------------------------------
    async def cancel_job(self, job: JobId, token: str) -> dict:
        """End the job: its program's process group is killed (SIGTERM, then SIGKILL), its
        calls fail, its States are released. Cancelling a finished job changes nothing."""
        self._visible(token, job)
        sub, record = self.submitted.get(job), self.jobs.get(job)
        if sub is None and record is None:
            raise ConfigError("no job of this name", field="job", value=job, fix="see `plexrl jobs`")
        if sub is not None and sub.state not in FINAL:
            sub.finish("cancelled", "cancelled by request")
            if sub.child is not None:
                sub.exit_code = await sub.child.kill(KILL_GRACE_S)
        if record is not None and self.jobs.get(job) is record:
            err = CallError(f"job {job} was cancelled", job=job)
            await self._end_job(job, record, err)
            if not record.placed.done():
                record.placed.set_exception(err)
        if sub is None:
            return {"job": job, "state": "cancelled"}
        return self._view(job, sub, self._queue_positions())

    async def stop_service(self, token: str) -> int:
        """``plexrl down``: cancel every submitted job (killing its program), then shut the
        controller's services down. Operator only. The number of jobs cancelled."""
        if not self._is_operator(token):
            raise AuthError("stopping the service needs the operator token")
        active = [job for job, sub in self.submitted.items() if sub.state not in FINAL]
        for job in active:
            await self.cancel_job(job, token)
        await self.shutdown()
        return len(active)
