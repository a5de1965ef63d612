"""Where each State of each job lives, and how it moves between tiers.

Owns: per State (named by ``str(StateKey)``, e.g. ``job-1/policy/trainer/weights``) its one
current copy (tier, version, buffer) and its older copies, read-only and counted until
``release``; ``move`` really copies the bytes into a buffer of the other tier with a single
``copy_`` (HOST<->DEVICE) or spills them to a checksummed file and restores them (HOST<->DISK,
``DiskStore``; DEVICE and DISK meet only through HOST); the pins that keep a State from moving while a call computes on it; a job's RNG
state (a side slot on HOST). Device bytes come from ``DeviceMemory``, host bytes from
``HostStore``, spill files from ``DiskStore``; this module only keeps the books. A move that
fails (out of memory, a bad checksum, an injected ``fail_at`` point) leaves the previous
copy current and unchanged and releases the partial new one.

Versions: ``create`` makes version 1; every move makes a new copy with the next version. By
default a move releases the old copy once the new one is complete (``keep_older=True``, or
``move(..., keep_old=True)``, keeps it read-only until ``release(key, version)``). During a
move both copies exist and both budgets are charged.

Thread-safe: one lock guards the books and is never held during a copy or a fresh
allocation, so a move of one State runs while a call computes on others.
Must not know: Ray, scheduling, engines, models.
"""

from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass

import numpy as np
import torch

from plexrl.protocol import Tier
from plexrl.runtime.tiers.device import DeviceMemory, DeviceOutOfMemory
from plexrl.runtime.tiers.disk import (ChecksumMismatch, DiskFile, DiskOutOfSpace, DiskStore,
                                       FailPoints, InjectedFailure, NoDirectPath)
from plexrl.runtime.tiers.host import HostBuffer, HostOutOfMemory, HostStore
from plexrl.runtime.tiers.records import (CopyInfo, MoveResult, NotResident, StateBusy,
                                          StoreStats, UnknownState)

__all__ = ["StateStore", "MoveResult", "CopyInfo", "StoreStats", "NotResident", "StateBusy",
           "UnknownState", "DeviceOutOfMemory", "HostOutOfMemory", "ChecksumMismatch",
           "DiskOutOfSpace", "InjectedFailure", "NoDirectPath"]

#: the transition a (src, dst) pair is, as named in failure points
_KINDS = {(Tier.DEVICE, Tier.HOST): "offload", (Tier.HOST, Tier.DEVICE): "onload",
          (Tier.HOST, Tier.DISK): "spill", (Tier.DISK, Tier.HOST): "restore",
          (Tier.DROPPED, Tier.DEVICE): "rebuild", (Tier.DROPPED, Tier.HOST): "rebuild"}


@dataclass(eq=False)
class _Copy:
    tier: Tier
    version: int
    buf: torch.Tensor | HostBuffer | DiskFile

    @property
    def data(self) -> torch.Tensor:
        """The flat uint8 bytes of this copy (not of a DISK copy: read its file)."""
        return self.buf.tensor if isinstance(self.buf, HostBuffer) else self.buf


@dataclass(eq=False)
class _Entry:
    num_bytes: int
    dtype: torch.dtype
    current: _Copy | None               # None: DROPPED
    older: dict[int, _Copy]
    version: int
    moving: bool = False
    pins: int = 0

    @property
    def tier(self) -> Tier:
        return self.current.tier if self.current else Tier.DROPPED


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class StateStore:
    """Current and older copies of every State of the jobs bound to one worker group."""

    def __init__(self, device: DeviceMemory, host: HostStore, keep_older: bool = False,
                 disk: DiskStore | None = None, fail_at: tuple[str, ...] = ()):
        """``disk``: where States spill (none: DISK is refused); ``fail_at``: test-only
        failure points (``disk.POINTS``), each failing the next move that reaches it."""
        self.device, self.host, self.disk, self.keep_older = device, host, disk, keep_older
        self.fail = FailPoints(fail_at)
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}

    # --- lifecycle of a State -------------------------------------------------------------

    def create(self, key, init: int | torch.Tensor, tier: Tier = Tier.DEVICE,
               dtype: torch.dtype = torch.float32) -> CopyInfo:
        """A new State on ``tier``: ``init`` is a byte count (zero-filled) or a tensor whose
        bytes are copied in (its dtype wins)."""
        key = str(key)
        if isinstance(init, torch.Tensor):
            dtype, num_bytes = init.dtype, init.numel() * init.element_size()
        else:
            num_bytes = int(init)
        if num_bytes <= 0 or num_bytes % torch.empty(0, dtype=dtype).element_size():
            raise ValueError(f"{key}: {num_bytes} B is not a positive number of {dtype}")
        with self._lock:
            if key in self._entries:
                raise ValueError(f"{key} already exists; drop or forget it first")
            entry = _Entry(num_bytes, dtype, None, {}, 0, moving=True)
            self._entries[key] = entry
        try:
            if tier == Tier.DISK:       # written straight to its spill file
                data = init.detach().reshape(-1).contiguous().cpu().view(torch.uint8) \
                    if isinstance(init, torch.Tensor) else torch.zeros(num_bytes, dtype=torch.uint8)
                copy = _Copy(tier, 1, self._disk().write(key, 1, data, dtype))
            else:
                copy = self._new_copy(key, tier, num_bytes, 1)
            if isinstance(init, torch.Tensor) and tier != Tier.DISK:
                copy.data.view(dtype).copy_(init.reshape(-1))
            elif tier != Tier.DISK:
                copy.data.zero_()
            if tier == Tier.HOST:
                self.host.publish(copy.buf, key, 1)
        except BaseException:
            with self._lock:
                del self._entries[key]
            raise
        self.host.save_side(f"dtype:{key}", _dtype_name(dtype).encode())
        with self._lock:
            entry.current, entry.version, entry.moving = copy, 1, False
        return CopyInfo(tier, 1, num_bytes, True)

    def move(self, key, dst: Tier, keep_old: bool | None = None) -> MoveResult:
        """Copy ``key``'s current copy into a new buffer (or spill file) on ``dst`` and make
        that current. The old copy is released, or kept read-only with ``keep_old`` (default:
        the store's ``keep_older``). DEVICE<->DISK is refused (``NoDirectPath``). On any
        failure (``DeviceOutOfMemory``, ``HostOutOfMemory``, ``DiskOutOfSpace``,
        ``ChecksumMismatch``, ``InjectedFailure``) the old copy stays current and unchanged
        and the new one is released; ``StateBusy`` if the State is moving or pinned."""
        key = str(key)
        if dst == Tier.DROPPED:
            src = self.where(key)
            self.drop(key)
            return MoveResult(key, src, Tier.DROPPED, self._entry(key).version, 0, 0.0)
        keep = self.keep_older if keep_old is None else keep_old
        with self._lock:
            entry = self._entry(key)
            self._check_idle(key, entry, f"move to {dst}")
            if entry.tier == dst:
                raise ValueError(f"{key} is already on {dst}")
            if (entry.tier, dst) not in _KINDS:
                raise NoDirectPath(key, entry.tier, dst)
            src, version = entry.current, entry.version + 1
            kind = _KINDS[(entry.tier, dst)]
            entry.moving = True
        new, checksum = None, ""
        try:
            start = time.perf_counter()
            if dst == Tier.DISK:
                new = _Copy(dst, version, self._disk().write(
                    key, version, src.data, entry.dtype, lambda p: self.fail.hit(kind, p)))
                checksum = new.buf.checksum
            else:
                new = self._new_copy(key, dst, entry.num_bytes, version)
                start = time.perf_counter()
                if src is None:
                    new.data.zero_()            # rebuilt from DROPPED: no bytes to copy
                elif src.tier == Tier.DISK:
                    checksum = self.disk.read_into(src.buf, new.data,
                                                   lambda p: self.fail.hit(kind, p))
                else:
                    self.fail.copy(kind, new.data, src.data)
                if new.data.is_cuda or (src is not None and src.tier != Tier.DISK
                                        and src.data.is_cuda):
                    torch.cuda.synchronize()
                self.fail.hit(kind, "after_copy")
            seconds = time.perf_counter() - start
            if dst == Tier.HOST:
                self.host.publish(new.buf, key, version)
        except BaseException:
            with self._lock:
                entry.moving = False
            if new is not None:
                self._free(key, new)
            raise
        with self._lock:
            entry.current, entry.version, entry.moving = new, version, False
            if src is not None and keep:
                entry.older[src.version] = src
        if src is not None and not keep:
            self._free(key, src)
        num_bytes = 0 if src is None else entry.num_bytes
        return MoveResult(key, src.tier if src else Tier.DROPPED, dst, version, num_bytes,
                          seconds, checksum)

    def release(self, key, version: int) -> None:
        """Release the older copy ``version`` of ``key``: its bytes and buffer go back."""
        key = str(key)
        with self._lock:
            copy = self._entry(key).older.pop(version, None)
        if copy is None:
            raise UnknownState(key, version)
        self._free(key, copy)

    def drop(self, key) -> None:
        """Release every copy of ``key``; it stays known, on DROPPED (rebuilt, not copied)."""
        key = str(key)
        with self._lock:
            entry = self._entry(key)
            self._check_idle(key, entry, "drop")
            copies = [*([entry.current] if entry.current else []), *entry.older.values()]
            entry.current, entry.older = None, {}
        for copy in copies:
            self._free(key, copy)

    def forget(self, prefix: str) -> int:
        """A job ended: release every copy of every State named ``prefix`` or under
        ``prefix/``, and their side slots. Returns the bytes released."""
        prefix = str(prefix).rstrip("/")
        with self._lock:
            keys = [k for k in self._entries if k == prefix or k.startswith(prefix + "/")]
            for key in keys:
                self._check_idle(key, self._entries[key], "forget")
            entries = [(k, self._entries.pop(k)) for k in keys]
        released = 0
        for key, entry in entries:
            for copy in [*([entry.current] if entry.current else []), *entry.older.values()]:
                self._free(key, copy)
                released += entry.num_bytes
            self.host.drop_side(f"dtype:{key}")
        self.host.drop_side(f"rng:{prefix}")
        return released

    # --- access ---------------------------------------------------------------------------

    def tensor(self, key) -> torch.Tensor:
        """The current DEVICE copy of ``key``: a flat, contiguous, writable tensor."""
        key = str(key)
        with self._lock:
            entry = self._entry(key)
            if entry.moving:
                raise StateBusy(key, "compute on", "moving")
            if entry.tier != Tier.DEVICE:
                raise NotResident(key, entry.tier)
            return entry.current.data.view(entry.dtype)

    @contextlib.contextmanager
    def use(self, *keys):
        """Pin ``keys`` for a call: yields their DEVICE tensors; none of them may move, drop
        or be forgotten until the block exits. All or nothing."""
        names = [str(k) for k in keys]
        with self._lock:
            entries = [self._entry(k) for k in names]
            for key, entry in zip(names, entries):
                if entry.moving:
                    raise StateBusy(key, "compute on", "moving")
                if entry.tier != Tier.DEVICE:
                    raise NotResident(key, entry.tier)
            for entry in entries:
                entry.pins += 1
            tensors = [e.current.data.view(e.dtype) for e in entries]
        try:
            yield tensors
        finally:
            with self._lock:
                for entry in entries:
                    entry.pins -= 1

    def read(self, key, version: int | None = None) -> np.ndarray:
        """A read-only view of the current copy (or of the older copy ``version``), on any
        tier: writing through it raises. A CUDA copy is read as a host snapshot."""
        key = str(key)
        with self._lock:
            entry = self._entry(key)
            found = [c for c in (entry.current, *entry.older.values())
                     if c is not None and version in (None, c.version)]
            if not found:
                raise UnknownState(key, version) if version is not None else \
                    NotResident(key, Tier.DROPPED)
            copy, dtype = found[0], entry.dtype
            if copy.tier == Tier.DISK:
                disk_file = copy.buf
            else:
                data = copy.data.view(dtype)
        if copy.tier == Tier.DISK:      # the file's bytes, mapped read-only
            return self._disk().view(disk_file).view(torch.empty(0, dtype=dtype).numpy().dtype)
        view = (data.cpu() if data.is_cuda else data).numpy().view()
        view.flags.writeable = False
        return view

    def location(self, key) -> int | str:
        """Where the current copy's bytes are: a buffer's address, or a spill file's path."""
        with self._lock:
            current = self._entry(str(key)).current
        if current is None:
            return 0
        return str(current.buf.path) if current.tier == Tier.DISK else current.data.data_ptr()

    def where(self, key) -> Tier:
        with self._lock:
            return self._entry(str(key)).tier

    def copies(self, key) -> list[CopyInfo]:
        """Every copy of ``key``, the current one first."""
        with self._lock:
            entry = self._entry(str(key))
            cur = [CopyInfo(entry.current.tier, entry.current.version, entry.num_bytes, True)] \
                if entry.current else []
            return cur + [CopyInfo(c.tier, v, entry.num_bytes, False)
                          for v, c in sorted(entry.older.items())]

    def keys(self) -> list[str]:
        with self._lock:
            return sorted(self._entries)

    def stats(self) -> StoreStats:
        with self._lock:
            num_older = sum(len(e.older) for e in self._entries.values())
            num_copies = num_older + sum(e.current is not None for e in self._entries.values())
            num_states = len(self._entries)
        used, pooled, allocated = self.host.counts()
        disk_used, disk_files, _ = self.disk.counts() if self.disk else (0, 0, 0)
        return StoreStats(self.device.stats(), used, pooled, allocated, num_states, num_copies,
                          num_older, disk_used, disk_files)

    # --- RNG side slot --------------------------------------------------------------------

    def save_rng(self, job: str, generator: torch.Generator) -> None:
        """Keep ``job``'s generator state on HOST (it survives a dead service)."""
        self.host.save_side(f"rng:{job}", generator.get_state().numpy().tobytes())

    def load_rng(self, job: str, generator: torch.Generator) -> bool:
        """Restore ``job``'s saved generator state into ``generator``; False if none saved."""
        data = self.host.load_side(f"rng:{job}")
        if data is None:
            return False
        generator.set_state(torch.frombuffer(bytearray(data), dtype=torch.uint8))
        return True

    # --- restart --------------------------------------------------------------------------

    @classmethod
    def reopen(cls, device: DeviceMemory, host: HostStore, keep_older: bool = False):
        """A store over the HOST copies a previous owner of ``host``'s directory published
        (a restarted service): per State the newest version is current, the rest older."""
        store = cls(device, host, keep_older)
        for key, versions in host.published().items():
            dtype = getattr(torch, (host.load_side(f"dtype:{key}") or b"float32").decode())
            copies = {v: _Copy(Tier.HOST, v, host.buffer_of(key, v)) for v in versions}
            current = copies.pop(versions[-1])
            store._entries[key] = _Entry(current.buf.num_bytes, dtype, current, copies,
                                         versions[-1])
        return store

    # --- helpers --------------------------------------------------------------------------

    def _entry(self, key: str) -> _Entry:
        entry = self._entries.get(key)
        if entry is None:
            raise UnknownState(key)
        return entry

    @staticmethod
    def _check_idle(key: str, entry: _Entry, doing: str) -> None:
        if entry.moving:
            raise StateBusy(key, doing, "moving")
        if entry.pins:
            raise StateBusy(key, doing, f"pinned by {entry.pins} running call(s)")

    def _new_copy(self, key: str, tier: Tier, num_bytes: int, version: int) -> _Copy:
        if tier == Tier.DEVICE:
            return _Copy(tier, version, self.device.alloc(num_bytes, what=key))
        if tier == Tier.HOST:
            return _Copy(tier, version, self.host.alloc(num_bytes))
        raise ValueError(f"{key}: cannot create a copy on {tier}")

    def _disk(self) -> DiskStore:
        if self.disk is None:
            raise ValueError("this store has no spill directory; fix: pass "
                             "StateStore(..., disk=DiskStore(root))")
        return self.disk

    def _free(self, key: str, copy: _Copy) -> None:
        if copy.tier == Tier.DEVICE:
            self.device.free(copy.buf)
        elif copy.tier == Tier.DISK:
            self.disk.remove(copy.buf)
        else:
            self.host.unpublish(key, copy.version)
            self.host.free(copy.buf)
