"""How the controller sends calls to the services and folds their finish, a mixin of the
controller.

Owns: ``_send`` (a Dispatch: journal it, send the order; a call sent behind the running one
names it, D180), ``_call_done`` (fold the finish: journal, call log, ``CallFinished``, plan
again; a call sent behind another is folded after it, its start that one's end) and
``_plan_again`` (a timer for when a group's plan may change with time alone: the core's
quiet windows). Uses the controller's ``snap``, ``calls``, ``journal``, ``executor``,
``call_log``, ``_last_sent``, ``_wake``, ``_wake_at``, ``_fold``, ``_plan``, ``_spawn``,
``_lost``. Must not know: what a call computes, scheduling.
"""

from __future__ import annotations

import asyncio
import math
import time

import ray

from plexrl.core import events as ev
from plexrl.errors import ServiceLost
from plexrl.protocol import CallId, Copy, Function, State, StateKey, WorkerGroupId
from plexrl.runtime.control import recovery
from plexrl.runtime.control.jobs import PendingCall
from plexrl.runtime.workers.order import CallOrder


class CallDispatch:
    def _send(self, call: CallId, wg: WorkerGroupId, now: float) -> None:
        """Send a dispatched call's order to its service (journalled first). A call the core
        put behind the running one names that one (``CallOrder.after``): the service runs it
        after it, and its finish is folded after that one's."""
        pending = self.calls[call]
        pending.wg, pending.started_at = wg, now
        after = None
        if wg in self.snap.behind:   # it runs, and its finish is folded, after that call
            ahead = self.calls[self.snap.running[wg].call].request
            after, pending.after = (ahead.job, ahead.seq), self._last_sent.get(wg)
        pending.folded = asyncio.get_running_loop().create_future()
        self._last_sent[wg] = pending.folded
        self.journal.dispatching(pending.request.job, pending.request.seq, call,
                                 pending.copy_seq, wg)   # before the go
        order = CallOrder(pending.request, call, pending.workspace_bytes, pending.copy_seq,
                          after, self._source_of(pending.request, wg))
        self._spawn(self._call_done(pending, self.executor.dispatch(wg, order)))

    def _source_of(self, request, wg: WorkerGroupId):
        """For a SYNC_WEIGHTS whose trainer copy is on another group: that group's service."""
        if request.function != Function.SYNC_WEIGHTS or self.config.engine != "torch":
            return None
        record = self.jobs.get(request.job)
        trainer = record.groups.get((request.role, Copy.TRAINER)) if record else None
        return self.executor.services.get(trainer) if trainer not in (None, wg) else None

    async def _call_done(self, pending: PendingCall, done) -> None:
        end = time.monotonic()
        try:
            end = await self._finished(pending, done)
        finally:
            if not pending.folded.done():
                pending.folded.set_result(end)

    async def _finished(self, pending: PendingCall, done) -> float:
        """Fold a call's finish, after the call it was sent behind (its start is that one's
        end); returns its end."""
        request = pending.request
        try:
            done = await done
        except ray.exceptions.RayActorError as err:
            self._lost(pending.wg, err)
            return time.monotonic()
        if done.get("lost_rank") is not None:   # a rank of its group died under it
            self._lost(pending.wg, ServiceLost(f"rank {done['lost_rank']} died"),
                       done["lost_rank"])
            return time.monotonic()
        if pending.after is not None:
            pending.started_at = max(pending.started_at, await pending.after)
        end = time.monotonic()
        self.calls.pop(pending.call, None)
        self.journal.finish(request.job, request.seq, "failed" if done["failed"] else "done",
                            done["failed"])
        if done.get("saved"):
            saved = done["saved"]
            self.journal.checkpoint(request.job, saved["role"], saved["version"], saved["path"])
        self.call_log.append({"call": pending.call, "job": request.job, "seq": request.seq,
                              "function": str(request.function), "role": str(request.role),
                              "step": request.step, "wg": pending.wg,
                              "queued_s": pending.queued_at, "start_s": pending.started_at,
                              "end_s": end, "duration_s": done["duration_s"],
                              "workspace_bytes": pending.workspace_bytes,
                              "behind": pending.after is not None, "failed": done["failed"]})
        if request.job in self.snap.jobs:
            self._fold(ev.CallFinished(call=pending.call, wg=pending.wg, at=end,
                                       duration_s=done["duration_s"]))
            weights = StateKey(request.job, request.role, request.copy, State.WEIGHTS,
                               request.lane)
            if weights in self.snap.states and request.function in recovery.VERSIONED:
                view = self.snap.states[weights]
                self.journal.state(weights, view.tier, view.version)
            self._plan()
        return end

    def _plan_again(self, now: float) -> None:
        """Plan again when a group's plan may change with time alone (the core's quiet
        windows: a call to send behind a running one, an HRRS pick overtaken), unless an
        event comes first."""
        until = min((u for _, u in self.snap.quiet_groups.windows.values() if u > now),
                    default=math.inf)
        if until == math.inf or (self._wake is not None and self._wake_at <= until):
            return
        if self._wake is not None:
            self._wake.cancel()
        self._wake_at = until
        self._wake = asyncio.get_running_loop().call_later(until - now, self._woken)

    def _woken(self) -> None:
        self._wake = None
        self._plan()
