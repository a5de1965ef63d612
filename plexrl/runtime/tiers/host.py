"""The HOST tier of one worker group: buffers that are files in shared memory.

Owns: a directory (by default ``/dev/shm/plexrl-<session>/<node>/<wg>``) laid out as

    pool/<num_bytes>-<seq>.buf     every buffer, mapped MAP_SHARED, free or holding a copy
    named/<quoted name>@<version>  a hard link to the buffer holding that copy, made once
                                   the copy is complete (so a reader never sees half a copy)
    side/<quoted name>             small side slots (a job's RNG state), replaced atomically

Because the bytes live in tmpfs files, not in the process, a dead service does not take
them along: another process reopens a copy by name (``open_published``), and a new
``HostStore`` on the same directory adopts the buffers (linked ones are in use, the rest are
free). Buffers are reused from a free list by size, created with their pages touched once.
Plain files, not ``multiprocessing.shared_memory``: Python 3.11's resource tracker unlinks a
segment when any process that attached to it exits.

With CUDA, buffers are page-locked in place (``cudaHostRegister``): ``Tensor.pin_memory()``
would copy into private pinned memory and lose the sharing. One process owns a directory at
a time; others only read. Must not know: States, versions' meaning, devices, Ray, scheduling.
"""

from __future__ import annotations

import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote, unquote

import numpy as np
import torch

from plexrl.errors import PlexError

SHM_ROOT = Path("/dev/shm")


class HostOutOfMemory(PlexError, MemoryError):
    """An alloc would exceed the host budget; nothing was changed."""

    def __init__(self, *, need_bytes: int, used_bytes: int, budget_bytes: int, root: str):
        super().__init__(
            f"host out of memory under {root}: needs {need_bytes} B but {used_bytes} B of a "
            f"{budget_bytes} B budget are used; fix: release older copies, forget ended jobs "
            f"or raise the host budget")
        self.need_bytes, self.used_bytes = need_bytes, used_bytes
        self.budget_bytes, self.root = budget_bytes, root


def default_host_root(session: str, node: str, wg: str) -> Path:
    """Where a worker group's HOST buffers live: tmpfs, outside every process."""
    return SHM_ROOT / f"plexrl-{session}" / quote(node, safe="") / quote(wg, safe="")


@dataclass(eq=False)
class HostBuffer:
    """One file-backed buffer: ``tensor`` is a flat uint8 view of its shared mapping."""

    path: Path
    num_bytes: int
    tensor: torch.Tensor = field(repr=False)


def _map(path: Path, num_bytes: int) -> torch.Tensor:
    return torch.from_file(str(path), shared=True, size=num_bytes, dtype=torch.uint8)


def _create(path: Path, num_bytes: int) -> torch.Tensor:
    """A new file of ``num_bytes``, its tmpfs pages allocated up front (fallocate, about
    twice as fast as faulting them in), mapped and touched once through the mapping."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.posix_fallocate(fd, 0, num_bytes)
    finally:
        os.close(fd)
    tensor = _map(path, num_bytes)
    tensor.zero_()
    return tensor


def _pin(buf: HostBuffer, on: bool) -> None:
    """Page-lock (or unlock) a buffer in place when CUDA is present; a no-op otherwise."""
    if not torch.cuda.is_available() or buf.num_bytes == 0:
        return
    cudart = torch.cuda.cudart()
    if on:     # flag 1: cudaHostRegisterPortable (pinned for every CUDA context)
        code = int(cudart.cudaHostRegister(buf.tensor.data_ptr(), buf.num_bytes, 1))
    else:
        code = int(cudart.cudaHostUnregister(buf.tensor.data_ptr()))
    if code != 0:
        raise RuntimeError(f"cudaHost{'Register' if on else 'Unregister'} of {buf.path} "
                           f"({buf.num_bytes} B) failed with cudaError {code}")


class HostStore:
    """File-backed HOST buffers of one worker group, with a budget over live buffers."""

    def __init__(self, root: Path | str, budget_bytes: int | None = None, pin: bool = True):
        self.root, self.budget_bytes = Path(root), budget_bytes
        self._pin = pin
        for sub in ("pool", "named", "side"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._free: dict[int, list[HostBuffer]] = {}
        self._live: dict[Path, HostBuffer] = {}
        self._used = self._pooled = self._allocated = self._seq = 0
        self._adopt()

    # --- buffers --------------------------------------------------------------------------

    def alloc(self, num_bytes: int) -> HostBuffer:
        """A buffer of ``num_bytes``: a free one of that size, else a new touched file."""
        num_bytes = int(num_bytes)
        with self._lock:
            if self.budget_bytes is not None and self._used + num_bytes > self.budget_bytes:
                raise HostOutOfMemory(need_bytes=num_bytes, used_bytes=self._used,
                                      budget_bytes=self.budget_bytes, root=str(self.root))
            pool = self._free.get(num_bytes)
            if pool:
                buf = pool.pop()
                self._pooled -= num_bytes
            else:
                if self.budget_bytes is not None:
                    self._trim(self.budget_bytes - self._used - num_bytes)
                self._seq += 1
                buf = HostBuffer(self.root / "pool" / f"{num_bytes}-{self._seq}.buf",
                                 num_bytes, torch.empty(0, dtype=torch.uint8))
                self._allocated += 1
            self._used += num_bytes
            self._live[buf.path] = buf
        if buf.tensor.numel() != num_bytes:   # new: create, map and touch it, unlocked
            try:
                buf.tensor = _create(buf.path, num_bytes)
                if self._pin:
                    _pin(buf, True)
            except BaseException:
                with self._lock:
                    self._used -= num_bytes
                    self._live.pop(buf.path, None)
                buf.path.unlink(missing_ok=True)
                raise
        return buf

    def free(self, buf: HostBuffer) -> None:
        """Return a buffer to the free list; unpublish its names first."""
        with self._lock:
            del self._live[buf.path]
            self._used -= buf.num_bytes
            self._pooled += buf.num_bytes
            self._free.setdefault(buf.num_bytes, []).append(buf)

    def trim(self) -> int:
        """Delete every pooled buffer's file; returns the bytes released."""
        with self._lock:
            before = self._pooled
            self._trim(0)
            return before

    # --- names ----------------------------------------------------------------------------

    def publish(self, buf: HostBuffer, name: str, version: int) -> None:
        """Make ``buf`` reopenable as (name, version); call once its bytes are complete."""
        os.link(buf.path, self._named(name, version))

    def unpublish(self, name: str, version: int) -> None:
        self._named(name, version).unlink(missing_ok=True)

    def published(self) -> dict[str, list[int]]:
        """Every published name with its versions, ascending (from the files, not memory)."""
        out: dict[str, list[int]] = {}
        for path in (self.root / "named").iterdir():
            name, _, version = path.name.rpartition("@")
            out.setdefault(unquote(name), []).append(int(version))
        return {name: sorted(versions) for name, versions in sorted(out.items())}

    def buffer_of(self, name: str, version: int) -> HostBuffer:
        """The live buffer published as (name, version) in this process (adopted or not)."""
        inode = self._named(name, version).stat().st_ino
        with self._lock:
            for buf in self._live.values():
                if buf.path.stat().st_ino == inode:
                    return buf
        raise LookupError(f"{name}@{version} is published but no live buffer holds it")

    def open_published(self, name: str, version: int | None = None) -> np.ndarray:
        """A read-only view of a published copy (default: its newest version), from any
        process: the file is mapped read-only, so writing through it raises."""
        if version is None:
            versions = self.published().get(name)
            if not versions:
                raise LookupError(f"no HOST copy of {name!r} is published under {self.root}")
            version = versions[-1]
        return np.memmap(self._named(name, version), dtype=np.uint8, mode="r")

    # --- side slots -----------------------------------------------------------------------

    def save_side(self, name: str, data: bytes) -> None:
        """Write a small blob (a job's RNG state) atomically under ``name``."""
        path = self.root / "side" / quote(name, safe="")
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def load_side(self, name: str) -> bytes | None:
        path = self.root / "side" / quote(name, safe="")
        return path.read_bytes() if path.exists() else None

    def drop_side(self, name: str) -> None:
        (self.root / "side" / quote(name, safe="")).unlink(missing_ok=True)

    # --- accounting and lifetime ----------------------------------------------------------

    @property
    def used_bytes(self) -> int:
        """Bytes of every live buffer (every copy on HOST, current or older)."""
        return self._used

    def counts(self) -> tuple[int, int, int]:
        """(used_bytes, pooled_bytes, buffers ever allocated by this process)."""
        with self._lock:
            return self._used, self._pooled, self._allocated

    def close(self, remove: bool = True) -> None:
        """Unpin and drop every mapping; ``remove``: delete the directory and its files."""
        with self._lock:
            for buf in [*self._live.values(), *(b for p in self._free.values() for b in p)]:
                if self._pin:
                    _pin(buf, False)
            self._live.clear()
            self._free.clear()
            self._used = self._pooled = 0
        if remove:
            shutil.rmtree(self.root, ignore_errors=True)

    def _named(self, name: str, version: int) -> Path:
        return self.root / "named" / f"{quote(name, safe='')}@{int(version)}"

    def _trim(self, room_bytes: int) -> None:
        for size in sorted(self._free, reverse=True):
            pool = self._free[size]
            while pool and self._pooled > max(room_bytes, 0):
                buf = pool.pop()
                if self._pin:
                    _pin(buf, False)
                buf.path.unlink(missing_ok=True)
                self._pooled -= size
            if not pool:
                del self._free[size]

    def _adopt(self) -> None:
        """Take over the buffers a previous owner left: linked ones live, the rest free."""
        for path in sorted((self.root / "pool").glob("*.buf")):
            size, _, seq = path.stem.partition("-")
            self._seq = max(self._seq, int(seq))
            buf = HostBuffer(path, int(size), _map(path, int(size)))
            if self._pin:
                _pin(buf, True)
            if path.stat().st_nlink > 1:
                self._live[path] = buf
                self._used += buf.num_bytes
            else:
                self._free.setdefault(buf.num_bytes, []).append(buf)
                self._pooled += buf.num_bytes
