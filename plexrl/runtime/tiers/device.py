"""The DEVICE tier of one worker group: a byte budget, reused buffers and dispatch reserves.

Owns: the device buffers States live in while on DEVICE, a free list of them keyed by size
(a buffer is allocated and touched once, on first need, then reused), the workspace reserves
a dispatch makes (KV cache for batch x (prompt + max_tokens), an activation estimate), and the
budget rule ``used_bytes + reserved_bytes <= budget_bytes``: ``alloc`` and ``reserve`` raise
``DeviceOutOfMemory`` and change nothing rather than break it.

How it departs from a caching allocator: pooled (free, cached) buffers are not charged to the
budget, but ``used + reserved + pooled`` is kept under the budget too, by trimming pooled
buffers of other sizes before a fresh allocation; so the memory really held never exceeds the
budget, which on a real GPU leaves the engine's own allocations the room the reserve promised.

Without CUDA (``device="cpu"``) the device is emulated in host RAM; with CUDA the buffers
are real cuda memory. Must not know: States, versions, host storage, Ray, scheduling.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

from plexrl.errors import PlexError


class DeviceOutOfMemory(PlexError, MemoryError):
    """An alloc or reserve would exceed a device's budget; nothing was changed."""

    def __init__(self, what: str, *, need_bytes: int, used_bytes: int, reserved_bytes: int,
                 budget_bytes: int):
        super().__init__(
            f"device out of memory: {what} needs {need_bytes} B but {used_bytes} B are used "
            f"and {reserved_bytes} B reserved of a {budget_bytes} B budget "
            f"({budget_bytes - used_bytes - reserved_bytes} B free); fix: offload or drop "
            f"a State, or release a reserve first")
        self.what, self.need_bytes, self.used_bytes = what, need_bytes, used_bytes
        self.reserved_bytes, self.budget_bytes = reserved_bytes, budget_bytes


def dispatch_reserve_bytes(*, kv_bytes_per_token: int, batch: int, prompt_tokens: int,
                           max_tokens: int, activation_bytes: int) -> int:
    """Device bytes a call reserves at dispatch: KV cache for batch x (prompt + max_tokens)
    tokens, plus the engine's activation estimate (bytes)."""
    return kv_bytes_per_token * batch * (prompt_tokens + max_tokens) + activation_bytes


@dataclass(frozen=True)
class DeviceStats:
    """A device's bytes at one moment."""

    budget_bytes: int
    used_bytes: int        #: buffers handed out (every copy of every State on DEVICE)
    reserved_bytes: int    #: workspace reserves of running calls
    pooled_bytes: int      #: free buffers kept for reuse (not charged to the budget)
    num_allocated: int     #: buffers ever allocated and touched (flat when reuse works)


class DeviceMemory:
    """The emulated (or, with CUDA, real) device memory of one worker group. Thread-safe."""

    def __init__(self, budget_bytes: int, device: str | torch.device = "cpu"):
        self.budget_bytes = int(budget_bytes)
        self.device = torch.device(device)
        self._lock = threading.Lock()
        self._free: dict[int, list[torch.Tensor]] = {}
        self._used = self._pooled = self._allocated = 0
        self._reserves: dict[str, int] = {}

    # --- buffers --------------------------------------------------------------------------

    def alloc(self, num_bytes: int, what: str = "a buffer") -> torch.Tensor:
        """A flat uint8 buffer of ``num_bytes`` on the device; reused from the free list when
        one of that size is free, else allocated and touched. Contents are undefined."""
        num_bytes = int(num_bytes)
        with self._lock:
            self._check(num_bytes, what)
            pool = self._free.get(num_bytes)
            if pool:
                self._pooled -= num_bytes
                self._used += num_bytes
                return pool.pop()
            self._trim(self.budget_bytes - self._used - self.reserved_bytes - num_bytes)
            self._used += num_bytes     # charged now; the slow first touch runs unlocked
            self._allocated += 1
        try:
            buf = torch.empty(num_bytes, dtype=torch.uint8, device=self.device)
            buf.zero_()                 # touch every page once, so later copies run warm
        except BaseException:
            with self._lock:
                self._used -= num_bytes
                self._allocated -= 1
            raise
        return buf

    def free(self, buf: torch.Tensor) -> None:
        """Return a buffer from ``alloc`` to the free list (it stays allocated for reuse)."""
        num_bytes = buf.numel()
        with self._lock:
            self._used -= num_bytes
            self._pooled += num_bytes
            self._free.setdefault(num_bytes, []).append(buf)

    def trim(self) -> int:
        """Release every pooled buffer (e.g. a job ended and its sizes will not recur);
        returns the bytes released."""
        with self._lock:
            before = self._pooled
            self._trim(0)
            return before

    # --- reserves -------------------------------------------------------------------------

    def reserve(self, name: str, num_bytes: int) -> None:
        """Reserve ``num_bytes`` of workspace under ``name`` (a call at dispatch)."""
        with self._lock:
            if name in self._reserves:
                raise ValueError(f"reserve {name!r} is already held; release it first")
            self._check(int(num_bytes), f"reserve {name!r}")
            self._trim(self.budget_bytes - self._used - self.reserved_bytes - int(num_bytes))
            self._reserves[name] = int(num_bytes)

    def release_reserve(self, name: str) -> None:
        """Give back the reserve ``name`` (the call finished); unknown names are ignored."""
        with self._lock:
            self._reserves.pop(name, None)

    # --- accounting -----------------------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        return self._used

    @property
    def reserved_bytes(self) -> int:
        return sum(self._reserves.values())

    def stats(self) -> DeviceStats:
        with self._lock:
            return DeviceStats(self.budget_bytes, self._used, self.reserved_bytes,
                               self._pooled, self._allocated)

    def _check(self, num_bytes: int, what: str) -> None:
        reserved = self.reserved_bytes
        if self._used + reserved + num_bytes > self.budget_bytes:
            raise DeviceOutOfMemory(what, need_bytes=num_bytes, used_bytes=self._used,
                                    reserved_bytes=reserved, budget_bytes=self.budget_bytes)

    def _trim(self, room_bytes: int) -> None:
        """Drop pooled buffers, largest first, until they fit in ``room_bytes``."""
        for size in sorted(self._free, reverse=True):
            pool = self._free[size]
            while pool and self._pooled > max(room_bytes, 0):
                pool.pop()
                self._pooled -= size
            if not pool:
                del self._free[size]
