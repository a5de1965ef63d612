"""The DISK tier of one worker group: spill files, their checksums, and injected failures.

Owns: ``DiskStore``, one safetensors file per State copy spilled from HOST, laid out as

    <root>/<quoted name>@<version>.safetensors        a finished spill file
    <root>/.<quoted name>@<version>.safetensors.tmp   the same file while it is written

A file holds one tensor ``data`` (the State's bytes in its dtype, flat) and, in the header's
``__metadata__``, the State's name, version, byte count and the xxh3_64 of its bytes. The
hash is computed once on spill (over the HOST bytes) and checked once on restore (over the
HOST buffer the bytes were read into), never on an in-memory move. A file is written under
its temp name and renamed when complete, so a finished name never holds half a file; it is
not fsynced unless asked: a spill file is a cache of live state, not a checkpoint, and the
page cache outlives a dead process (docs/design.md, D87). Bytes of finished files are counted.

Also owns ``FailPoints``, the test-only knob that makes a move fail at a named point, and the
errors of this tier. Must not know: which State is current, budgets of other tiers, Ray,
scheduling, why a State is spilled.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable
from urllib.parse import quote

import numpy as np
import torch
import xxhash

from plexrl.errors import PlexError

#: every point a failure can be injected at, "<transition>:<point>"
POINTS = ("offload:mid_copy", "offload:after_copy", "onload:mid_copy", "onload:after_copy",
          "spill:mid_write", "spill:after_write", "spill:after_rename",
          "restore:mid_copy", "restore:after_copy")

_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
           torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.int16: "I16",
           torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


class ChecksumMismatch(PlexError, OSError):
    """A spill file's bytes are not the bytes that were spilled; the State stays on DISK."""

    def __init__(self, path: str, key: str, version: int, expected: str, actual: str):
        super().__init__(
            f"spill file {path} ({key} version {version}) is corrupt: its xxh3_64 was "
            f"{expected} when spilled but the bytes read back hash to {actual}; the State stays "
            f"on disk and nothing was restored; fix: the file was changed after it was written "
            f"(a failing disk, or another process writing in the spill directory): check the "
            f"disk, then resume the job from its last SAVE")
        self.path, self.key, self.version = path, key, version
        self.expected, self.actual = expected, actual


class InjectedFailure(PlexError, RuntimeError):
    """A failure a test asked for (``fail_at``) at a named point of a transition."""

    def __init__(self, point: str):
        super().__init__(f"injected failure at {point}; fix: this is a test knob "
                         f"(StateStore(fail_at=...)), do not set it outside tests")
        self.point = point


class NoDirectPath(PlexError, ValueError):
    """A move between tiers that are not neighbours: DEVICE and DISK meet only through HOST."""

    def __init__(self, key: str, src, dst):
        super().__init__(f"cannot move {key} from {src} to {dst} directly: DISK is reached "
                         f"only from HOST; fix: move it to host first (the core always does)")
        self.key, self.src, self.dst = key, src, dst


class DiskOutOfSpace(PlexError, OSError):
    """A spill would exceed the disk budget; nothing was written."""

    def __init__(self, *, need_bytes: int, used_bytes: int, budget_bytes: int, root: str):
        super().__init__(f"disk budget exceeded under {root}: needs {need_bytes} B but "
                         f"{used_bytes} B of a {budget_bytes} B budget are used; fix: forget "
                         f"ended jobs or raise disk_bytes")
        self.need_bytes, self.used_bytes = need_bytes, used_bytes
        self.budget_bytes, self.root = budget_bytes, root


def xxh3(data) -> str:
    """The xxh3_64 of a buffer (numpy array, memoryview, bytes) as 16 hex digits."""
    return xxhash.xxh3_64_hexdigest(data)


def host_bytes(tensor: torch.Tensor) -> np.ndarray:
    """A flat uint8 numpy view of a CPU tensor's bytes (no copy)."""
    return tensor.reshape(-1).view(torch.uint8).numpy()


class FailPoints:
    """Armed failure points; each fires once (``InjectedFailure``) and is then disarmed, so
    the retried move succeeds."""

    def __init__(self, points: Iterable[str] = ()):
        self.armed: set[str] = set()
        for point in points:
            self.arm(point)

    def arm(self, point: str) -> None:
        if point not in POINTS:
            raise ValueError(f"unknown failure point {point!r}; known: {', '.join(POINTS)}")
        self.armed.add(point)

    def hit(self, kind: str, point: str) -> None:
        name = f"{kind}:{point}"
        if name in self.armed:
            self.armed.discard(name)
            raise InjectedFailure(name)

    def copy(self, kind: str, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``dst.copy_(src)``; with ``<kind>:mid_copy`` armed, fails after half the bytes."""
        if f"{kind}:mid_copy" in self.armed:
            half = dst.numel() // 2
            dst[:half].copy_(src[:half])
            self.hit(kind, "mid_copy")
        dst.copy_(src)


@dataclass(frozen=True)
class DiskFile:
    """One finished spill file: a State copy's bytes and the hash they had when spilled."""

    path: Path
    key: str
    version: int
    num_bytes: int
    checksum: str         #: xxh3_64 of the bytes, hex


class DiskStore:
    """Spill files of one worker group under ``root``, with an optional byte budget."""

    def __init__(self, root: Path | str, budget_bytes: int | None = None, fsync: bool = False):
        self.root, self.budget_bytes, self.fsync = Path(root), budget_bytes, fsync
        self.root.mkdir(parents=True, exist_ok=True)
        for stale in self.root.glob(".*.tmp"):      # half files of a writer that died
            stale.unlink(missing_ok=True)
        self._lock = threading.Lock()
        self._files: dict[Path, DiskFile] = {}
        self._used = self._written = 0

    def write(self, key: str, version: int, data: torch.Tensor, dtype: torch.dtype,
              hit: Callable[[str], None] = lambda point: None) -> DiskFile:
        """Spill ``data`` (flat uint8, on the CPU) as ``key``@``version``: hashed, written to
        a temp name, renamed. On any failure no file of it is left and nothing is counted."""
        num_bytes = data.numel()
        with self._lock:
            if self.budget_bytes is not None and self._used + num_bytes > self.budget_bytes:
                raise DiskOutOfSpace(need_bytes=num_bytes, used_bytes=self._used,
                                     budget_bytes=self.budget_bytes, root=str(self.root))
            self._used += num_bytes                # charged while written, like a new buffer
        src = host_bytes(data)
        name = f"{quote(key, safe='')}@{int(version)}.safetensors"
        path, tmp = self.root / name, self.root / f".{name}.tmp"
        file = DiskFile(path, key, int(version), num_bytes, xxh3(src))
        try:
            with open(tmp, "wb") as out:
                out.write(_header(file, dtype))
                half = num_bytes // 2
                out.write(memoryview(src[:half]))
                hit("mid_write")
                out.write(memoryview(src[half:]))
                out.flush()
                if self.fsync:
                    os.fsync(out.fileno())
            hit("after_write")
            os.replace(tmp, path)
            if self.fsync:
                _fsync_dir(self.root)
            hit("after_rename")
        except BaseException:
            tmp.unlink(missing_ok=True)
            path.unlink(missing_ok=True)
            with self._lock:
                self._used -= num_bytes
            raise
        with self._lock:
            self._files[path] = file
            self._written += num_bytes
        return file

    def read_into(self, file: DiskFile, out: torch.Tensor,
                  hit: Callable[[str], None] = lambda point: None) -> str:
        """Read ``file``'s bytes into ``out`` (flat uint8, CPU) and check their hash against
        the header's and the one recorded at spill; returns it, or raises ``ChecksumMismatch``
        (``out`` then holds garbage: the caller releases it)."""
        dst = memoryview(host_bytes(out))
        with open(file.path, "rb", buffering=0) as src:
            try:
                meta, start = _read_header(src, file.num_bytes)
                stored = meta.get("xxh3_64", "")
                src.seek(start)
                half = file.num_bytes // 2
                _read_exactly(src, dst[:half])
                hit("mid_copy")
                _read_exactly(src, dst[half:])
            except (ValueError, KeyError, TypeError, struct.error) as err:
                raise ChecksumMismatch(str(file.path), file.key, file.version, file.checksum,
                                       f"<unreadable: {err}>") from None
        actual = xxh3(dst)
        if actual != file.checksum or stored != file.checksum:
            raise ChecksumMismatch(str(file.path), file.key, file.version,
                                   file.checksum, actual if actual != file.checksum else
                                   f"{actual} (header says {stored})")
        return actual

    def view(self, file: DiskFile) -> np.ndarray:
        """A read-only mapping of ``file``'s data bytes (uint8)."""
        with open(file.path, "rb") as src:
            _, start = _read_header(src, file.num_bytes)
        return np.memmap(file.path, dtype=np.uint8, mode="r", offset=start,
                         shape=(file.num_bytes,))

    def remove(self, file: DiskFile) -> None:
        """Delete a spill file and stop counting its bytes."""
        with self._lock:
            if self._files.pop(file.path, None) is None:
                return
            self._used -= file.num_bytes
        file.path.unlink(missing_ok=True)

    @property
    def used_bytes(self) -> int:
        """Bytes of every finished spill file (and of the ones being written)."""
        return self._used

    def counts(self) -> tuple[int, int, int]:
        """(used_bytes, number of files, bytes ever written by this store)."""
        with self._lock:
            return self._used, len(self._files), self._written

    def close(self, remove: bool = True) -> None:
        """Forget every file; ``remove``: delete the directory and its files."""
        with self._lock:
            self._files.clear()
            self._used = 0
        if remove:
            shutil.rmtree(self.root, ignore_errors=True)


def _header(file: DiskFile, dtype: torch.dtype) -> bytes:
    """The safetensors header of a one-tensor file: 8-byte length, JSON padded to 8 bytes."""
    element = torch.empty(0, dtype=dtype).element_size()
    meta = {"key": file.key, "version": str(file.version), "num_bytes": str(file.num_bytes),
            "xxh3_64": file.checksum}
    body = {"__metadata__": meta,
            "data": {"dtype": _DTYPES[dtype], "shape": [file.num_bytes // element],
                     "data_offsets": [0, file.num_bytes]}}
    text = json.dumps(body, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


def _read_header(src, num_bytes: int) -> tuple[dict, int]:
    """(metadata, offset of the data) of a spill file; ``ValueError`` if it is not one."""
    (length,) = struct.unpack("<Q", src.read(8))
    if length > 1 << 20:
        raise ValueError(f"header length {length}")
    header = json.loads(src.read(length))
    begin, end = header["data"]["data_offsets"]
    if end - begin != num_bytes:
        raise ValueError(f"holds {end - begin} B, expected {num_bytes} B")
    return header["__metadata__"], 8 + length + begin


def _read_exactly(src, dst: memoryview) -> None:
    done = 0
    while done < len(dst):
        n = src.readinto(dst[done:])
        if not n:
            raise ValueError(f"the file ends {len(dst) - done} B early")
        done += n


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
