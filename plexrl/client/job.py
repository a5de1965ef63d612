"""The verbs a job calls: ``Runtime.register_job`` and the ``JobClient`` it returns.

Owns: turning a verb into a ``CallRequest`` with the job's next sequence number (assigned
under a lock, so calls issued from many threads still have one order), the weight version a
GENERATE samples (max(0, step - staleness)) and the version a SYNC_WEIGHTS installs (the
OPTIM_STEPs and LOADs issued before it, each a new trainer version), splitting a GENERATE
and a SYNC_WEIGHTS over the job's rollout lanes (one call per lane, each taking its share of
the rows; the answers joined in row order), and the ``_async`` twin of every verb. Each verb
returns a ``concurrent.futures.Future`` at once; the runtime runs the job's calls in
sequence-number order whatever order they reach it in.
Must not know: how the transport carries a request, numpy, torch, Ray.
"""

from __future__ import annotations

import asyncio
import os
import threading
import zlib
from concurrent.futures import Future

from plexrl.client.transport import Transport, open_transport
from plexrl.errors import ConfigError
from plexrl.protocol import (CallRequest, Function, JobId, JobRequest, ModelSpec, Role, Ticket,
                             shares)


class Runtime:
    """A connection to a runtime; register jobs on it."""

    def __init__(self, transport: Transport):
        self.transport = transport

    def register_job(self, job: str, models: dict[str | Role, ModelSpec], *, staleness: int = 0,
                     seed: int = 0, priority: int = 0, save_interval: int = 0,
                     rollout_lanes: int = 1, rollout_split: str = "rows") -> "JobClient":
        """Register a job and wait until it is placed; a model that fits no worker group
        raises ``PlacementError`` with the sizes. With ``save_interval`` N the runtime
        writes a checkpoint of the trainer every N weight versions (a job resumes from the
        last one after a crash: ``ServiceLost.checkpoint``, ``inspect("resumable")``). With
        ``rollout_lanes`` L the policy's rollout copy is L lanes, each bound to a worker group
        the runtime chooses (shared with other jobs' lanes): every GENERATE is split over
        them by rows, or with ``rollout_split="calls"`` goes whole to one lane in turn, with
        the tokens one copy samples either way (docs/design.md, D206)."""
        if staleness not in (0, 1):
            raise ConfigError("staleness must be 0 or 1", field="staleness", value=staleness,
                              fix="0: on-policy; 1: one step off-policy")
        request = JobRequest(JobId(job), tuple((Role(r), s) for r, s in models.items()),
                             staleness=staleness, seed=seed, priority=priority,
                             save_interval=save_interval, rollout_lanes=rollout_lanes,
                             rollout_split=rollout_split)
        ticket = self.transport.register(request).result()
        return JobClient(self.transport, ticket, request)

    def attach_job(self, job: str | None = None, token: str | None = None) -> "JobClient":
        """Take over a job registered elsewhere, by its ticket; a program that ``plexrl
        submit`` started finds both in ``PLEXRL_JOB`` and ``PLEXRL_JOB_TOKEN``."""
        job = job or os.environ.get("PLEXRL_JOB")
        token = token or os.environ.get("PLEXRL_JOB_TOKEN")
        if not job or not token:
            raise ConfigError("attaching needs a job and its token", field="PLEXRL_JOB",
                              value=job, fix="run the program through `plexrl submit`, or pass "
                              "job= and token=")
        attach = getattr(self.transport, "attach", None)
        if attach is None:
            raise ConfigError("this transport cannot attach to a job", field="address",
                              fix="connect to a running controller (controller=NAME)")
        ticket = Ticket(JobId(job), token)
        return JobClient(self.transport, ticket, attach(ticket).result())

    def inspect(self, what: str):
        """Read-only runtime records by name ("calls", "transitions", "status")."""
        return self.transport.inspect(what).result()

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def connect(address: str | None = None, **options) -> Runtime:
    """Connect to a runtime: the embedded local one by default, else ``address``."""
    return Runtime(open_transport(address, **options))


def connect_submitted() -> tuple[Runtime, "JobClient"] | None:
    """In a program that ``plexrl submit`` started: the running controller's runtime and the
    job it placed (from ``PLEXRL_ADDRESS``, ``PLEXRL_CONTROLLER``, ``PLEXRL_JOB`` and
    ``PLEXRL_JOB_TOKEN``); None anywhere else."""
    if "PLEXRL_JOB" not in os.environ:
        return None
    runtime = connect(os.environ["PLEXRL_ADDRESS"], controller=os.environ["PLEXRL_CONTROLLER"])
    return runtime, runtime.attach_job()


class JobClient:
    """One job's verbs. Each returns a Future; ``<verb>_async`` returns an awaitable."""

    def __init__(self, transport: Transport, ticket: Ticket, request: JobRequest):
        self.transport, self.ticket, self.request = transport, ticket, request
        self._lock = threading.Lock()
        self._seq = 0
        self._versions: dict[Role, int] = {}   #: trainer weight versions issued, per model
        self._generates = zlib.crc32(str(ticket.job).encode())   #: turns of split="calls"

    @property
    def job(self) -> JobId:
        return self.ticket.job

    # -- verbs ----------------------------------------------------------------------------
    def generate(self, prompts, *, step: int, max_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, stop: tuple[int, ...] = (), role: Role = Role.POLICY) -> Future:
        """Sample completions of ``prompts`` (lists of token ids) with the weights of version
        max(0, step - staleness); the result has tokens, lengths, logprobs and version.
        Over several rollout lanes it is one call per lane, each sampling its share of the
        rows (every lane gets all prompts: padding and noise are the whole batch's); the
        answer waits only for the lanes that sample rows (the others, which only keep their
        sampling stream in step, run in their lane's order when the lane is free)."""
        options = {"temperature": temperature, "top_p": top_p, "stop": tuple(stop)}
        fields = dict(step=step, version=max(0, step - self.request.staleness),
                      max_tokens=max_tokens, seq_len=max(map(len, prompts), default=0))
        lanes = self.request.rollout_lanes
        if lanes == 1:
            return self._call(Function.GENERATE, role, {"prompts": prompts}, options=options,
                              num_sequences=len(prompts), **fields)
        with self._lock:
            if self.request.rollout_split == "calls":   # all rows to one lane, in turn
                turn, self._generates = self._generates % lanes, self._generates + 1
                split = [(0, len(prompts)) if lane == turn else (len(prompts),) * 2
                         for lane in range(lanes)]
            else:
                split = shares(len(prompts), lanes)
            parts = [(self._call(Function.GENERATE, role, {"prompts": prompts},
                                 options={**options, "rows": rows}, lane=lane, locked=True,
                                 num_sequences=max(1, rows[1] - rows[0]), **fields), rows)
                     for lane, rows in enumerate(split)]
        return _joined([part for part, (start, stop) in parts if stop > start], _join_rows)

    def logprobs(self, batch: dict, *, role: Role = Role.POLICY, temperature: float = 1.0,
                 step: int = 0, loss: str | None = None, **loss_args) -> Future:
        """Per-token log-probabilities of ``batch["input_ids"]`` (values, for a value head);
        of ``batch["target_tokens"]`` at each position when it has them. With ``loss``,
        that loss and its metrics on the batch instead, no gradient taken."""
        options = {"temperature": temperature} if loss is None else {"loss": loss, **loss_args}
        return self._call(Function.LOGPROBS, role, batch, step=step, options=options,
                          **_sizes(batch))

    def forward_backward(self, batch: dict, *, loss: str, role: Role = Role.POLICY,
                         step: int = 0, **loss_args) -> Future:
        """Run loss ``loss`` (by name) on ``batch`` and accumulate its gradients."""
        return self._call(Function.FORWARD_BACKWARD, role, batch, step=step,
                          options={"loss": loss, **loss_args}, **_sizes(batch))

    def optim_step(self, *, lr: float, role: Role = Role.POLICY, step: int = 0,
                   **hyper) -> Future:
        """Apply the accumulated gradients (AdamW) and zero them: a new weight version."""
        with self._lock:
            self._versions[role] = self._versions.get(role, 0) + 1
            return self._call(Function.OPTIM_STEP, role, None, step=step,
                              options={"lr": lr, **hyper}, locked=True)

    def sync_weights(self, *, role: Role = Role.POLICY, step: int = 0) -> Future:
        """Install the trainer's weights (as of the OPTIM_STEPs and LOADs issued so far) in
        the rollout copy; the result is the version installed."""
        with self._lock:
            version = self._versions.get(role, 0)
            lanes = self.request.rollout_lanes if Role(role) == Role.POLICY else 1
            parts = [self._call(Function.SYNC_WEIGHTS, role, None, step=step, version=version,
                                lane=lane, locked=True) for lane in range(lanes)]
        return parts[0] if lanes == 1 else _joined(parts, lambda answers: answers[0])

    def save(self, path: str, *, role: Role = Role.POLICY) -> Future:
        """Write the trainer copy's weights, optimizer state and sampling generator to ``path``."""
        return self._call(Function.SAVE, role, None, options={"path": str(path)})

    def load(self, path: str, *, role: Role = Role.POLICY, version: int = 0,
             optimizer: bool = True) -> Future:
        """Read what ``save`` wrote back into the trainer copy: a new weight version, or, with
        ``version`` (a job resuming from a checkpoint of that version), that version. With
        ``optimizer=False`` only the weights: the optimizer starts afresh, the sampling
        generator goes on."""
        options = {"path": str(path)} if optimizer else {"path": str(path), "optimizer": False}
        with self._lock:
            current = self._versions.get(role, 0)
            self._versions[role] = version if version > current else current + 1
            return self._call(Function.LOAD, role, None, options=options,
                              version=self._versions[role] if version > current else 0,
                              locked=True)

    def end(self) -> None:
        """Release the job's states and bindings."""
        self.transport.end(self.ticket).result()

    # -- plumbing ---------------------------------------------------------------------------
    def _call(self, function: Function, role: Role, payload, *, options: dict | None = None,
              locked: bool = False, **fields) -> Future:
        if not locked:
            with self._lock:
                return self._call(function, role, payload, options=options, locked=True,
                                  **fields)
        request = CallRequest(self.job, self.ticket.token, self._seq, function, Role(role),
                              options=tuple(sorted((options or {}).items())), payload=payload,
                              **fields)
        self._seq += 1
        return self.transport.submit(request)


def _twin(verb: str):
    """``<verb>_async``: issues the call at once (so it takes its sequence number now) and
    returns an awaitable of its result."""
    def issue(self: JobClient, *args, **kwargs):
        future = getattr(self, verb)(*args, **kwargs)

        async def result():
            return await asyncio.wrap_future(future)
        return result()
    issue.__name__ = issue.__qualname__ = f"{verb}_async"
    issue.__doc__ = f"The awaitable twin of ``{verb}``."
    return issue


for _verb in ("generate", "logprobs", "forward_backward", "optim_step", "sync_weights", "save",
              "load"):
    setattr(JobClient, f"{_verb}_async", _twin(_verb))


def _joined(parts: list[Future], join) -> Future:
    """One future for the lanes' calls: ``join`` of their results in lane order, or the
    first lane's error (in lane order) once all have answered."""
    out: Future = Future()
    left = [len(parts)]
    lock = threading.Lock()

    def done(_: Future) -> None:
        with lock:
            left[0] -= 1
            if left[0]:
                return
        for part in parts:
            if part.exception() is not None:
                out.set_exception(part.exception())
                return
        out.set_result(join([part.result() for part in parts]))
    for part in parts:
        part.add_done_callback(done)
    return out


def _join_rows(answers: list[dict]) -> dict:
    """The lanes' GENERATE answers as one: per-row arrays stacked in row order (by the
    arrays' own namespace, the array API standard: the client imports no numpy), the
    rest (``version``) from the first lane."""
    out = {}
    for key, first in answers[0].items():
        if hasattr(first, "__array_namespace__") and getattr(first, "ndim", 0) > 0:
            out[key] = first.__array_namespace__().concat([a[key] for a in answers], axis=0)
        else:
            out[key] = first
    return out


def _sizes(batch: dict) -> dict[str, int]:
    """Sequences and their length in a batch of arrays or lists (no numpy needed)."""
    ids = batch.get("input_ids") if isinstance(batch, dict) else None
    if ids is None:
        return {}
    shape = getattr(ids, "shape", None) or (len(ids), max(map(len, ids), default=0))
    return {"num_sequences": int(shape[0]), "seq_len": int(shape[1]) if len(shape) > 1 else 0}
