"""The asyncio shell of a service actor: where a job's call meets the controller's go.

Owns: the rendezvous of each call, keyed by (job, sequence number). The job's client sends
the call with its payload straight to the service of its worker group (``run``); the
controller, when the core dispatches the call, sends ``go`` with the call's place in its
job's order. The call runs once both have arrived, and its result goes back to the job
directly: neither its payload nor its result ever passes through the controller, which
gets a small record (``go``'s answer) to fold. Calls compute on one thread and transitions
copy on another, so prefetch overlaps the running call. The service (and so torch) is
imported in this actor's process only; the controller that starts it never imports torch.
Must not know: scheduling, or what a call computes.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

from plexrl.errors import OrderError


class _Rendezvous:
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.payload: asyncio.Future = loop.create_future()   #: set when the job's call arrives
        self.result: asyncio.Future = loop.create_future()    #: set when it ran (or failed)


class ServiceActor:
    def __init__(self, *args):
        from plexrl.runtime.service import Service
        self._service = Service(*args)
        self._compute = ThreadPoolExecutor(1, thread_name_prefix="compute")
        self._copy = ThreadPoolExecutor(1, thread_name_prefix="copy")
        self._calls: dict[tuple[str, int], _Rendezvous] = {}

    async def ready(self) -> dict:
        return await self._on(self._compute, self._service.ready)

    async def bind(self, *args) -> None:
        return await self._on(self._compute, self._service.bind, *args)

    async def unbind(self, job: str, err: Exception) -> None:
        """Forget a job: its calls still waiting here fail with ``err``."""
        for (owner, _), slot in list(self._calls.items()):
            if owner == job and not slot.result.done():
                slot.result.set_exception(err)
        await self._on(self._compute, self._service.unbind, job)

    # -- calls -------------------------------------------------------------------------------
    async def run(self, request, payload):
        """A job's call: waits for the controller's go, then answers the job with its result."""
        self._service.check_token(request)
        slot = self._slot(request.job, request.seq)
        if slot.payload.done():
            raise OrderError(f"job {request.job}: sequence number {request.seq} was already used",
                             job=request.job, seq=request.seq)
        slot.payload.set_result(payload)
        try:
            return await slot.result
        finally:
            self._calls.pop((request.job, request.seq), None)

    async def go(self, order) -> dict:
        """The controller dispatched ``order``: run it once its payload is here."""
        slot = self._slot(order.request.job, order.request.seq)
        payload = await slot.payload
        start = time.perf_counter()
        try:
            result = await self._on(self._compute, self._service.run, order, payload)
        except Exception as err:   # the job reads it from its result; the controller goes on
            if not slot.result.done():
                slot.result.set_exception(err)
            return {"duration_s": time.perf_counter() - start, "failed": type(err).__name__}
        if not slot.result.done():
            slot.result.set_result(result)
        return {"duration_s": time.perf_counter() - start, "failed": ""}

    async def fail(self, job: str, seq: int, err: Exception) -> None:
        """The controller refused the call: its job gets ``err``."""
        slot = self._slot(job, seq)
        if not slot.result.done():
            slot.result.set_exception(err)

    # -- transitions and records -------------------------------------------------------------
    async def move(self, *args) -> dict:
        return await self._on(self._copy, self._service.move, *args)

    async def transitions(self, failed: bool = False, start: int = 0) -> list[dict]:
        return self._service.transitions(failed, start)

    async def stats(self) -> dict:
        return self._service.stats()

    async def close(self) -> None:
        await self._on(self._compute, self._service.close)

    def _slot(self, job: str, seq: int) -> _Rendezvous:
        key = (job, seq)
        if key not in self._calls:
            self._calls[key] = _Rendezvous(asyncio.get_running_loop())
        return self._calls[key]

    @staticmethod
    async def _on(pool: ThreadPoolExecutor, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
