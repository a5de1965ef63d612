"""Tinker's futures: a call answers ``{"request_id"}`` at once and its result is polled for.

Owns: the request ids, the task behind each (on the Tinker server's loop), which key may read
it, and answering ``retrieve_future``: the result (JSON, or the protobuf bytes of the two
results the SDK reads only that way), ``{"error", "category"}`` (the SDK raises its
``RequestFailedError``), or, after ``LONG_POLL_S`` without one, ``{"type": "try_again"}``
(the SDK polls again at once, so the wait is here). Finished results are kept until
``KEEP`` newer ones have finished.
Must not know: what a call does.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import OrderedDict
from typing import Awaitable

from plexrl.errors import PlexError

LONG_POLL_S = 20.0     #: under the SDK's 45 s timeout on retrieve_future
KEEP = 4096


class UserError(Exception):
    """A call that failed on what the user sent (category ``user``); others are ``server``."""


class Futures:
    def __init__(self, prefix: str):
        self._ids = itertools.count(1)
        self.prefix = prefix
        self._tasks: dict[str, tuple[str, asyncio.Task]] = {}
        self._done: OrderedDict[str, None] = OrderedDict()

    def add(self, key: str, work: Awaitable) -> str:
        request_id = f"{self.prefix}-{next(self._ids)}"
        task = asyncio.ensure_future(work)
        self._tasks[request_id] = (key, task)
        task.add_done_callback(lambda _: self._finished(request_id))
        return request_id

    def _finished(self, request_id: str) -> None:
        self._done[request_id] = None
        while len(self._done) > KEEP:
            old, _ = self._done.popitem(last=False)
            self._tasks.pop(old, None)

    def task(self, key: str, request_id: str) -> asyncio.Task | None:
        owner, task = self._tasks.get(str(request_id), ("", None))
        return task if task is not None and owner == key else None

    async def retrieve(self, key: str, request_id: str, wait_s: float = LONG_POLL_S):
        """``(found, outcome)``: outcome is the result, an error body or a try-again body."""
        task = self.task(key, request_id)
        if task is None:
            return False, None
        try:
            result = await asyncio.wait_for(asyncio.shield(task), wait_s)
        except asyncio.TimeoutError:
            return True, {"type": "try_again", "request_id": request_id, "queue_state": "active"}
        except asyncio.CancelledError:
            if not task.cancelled():
                raise   # this poll was cancelled (the server stops), not the call
            return True, {"error": "the request was cancelled", "category": "user"}
        except (UserError, PlexError) as err:
            return True, {"error": str(err), "category": "user"}
        except Exception as err:   # the server's fault: say what it was
            return True, {"error": f"{type(err).__name__}: {err}", "category": "server"}
        return True, result

    def cancel(self, key: str, request_id: str) -> bool:
        task = self.task(key, request_id)
        return task is not None and task.cancel()
