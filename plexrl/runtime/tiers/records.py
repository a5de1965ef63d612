"""The records and errors of the state storage (``StateStore`` in store.py).

Owns: ``MoveResult``, ``CopyInfo``, ``StoreStats`` (frozen, what the store answers) and the
store's own errors ``NotResident``, ``StateBusy``, ``UnknownState``. Must not know: how
bytes move, Ray, scheduling.
"""

from __future__ import annotations

from dataclasses import dataclass

from plexrl.errors import PlexError
from plexrl.protocol import Tier
from plexrl.runtime.tiers.device import DeviceStats


class NotResident(PlexError, LookupError):
    """A State's current copy is not on DEVICE, so no call may compute on it."""

    def __init__(self, key: str, tier: Tier):
        super().__init__(f"{key} is on {tier}, not on device; fix: move it to device first")
        self.key, self.tier = key, tier


class StateBusy(PlexError, RuntimeError):
    """A State is moving, or pinned by a running call, so this operation must wait."""

    def __init__(self, key: str, doing: str, why: str):
        super().__init__(f"cannot {doing} {key}: it is {why}; fix: wait until it finishes")
        self.key, self.doing, self.why = key, doing, why


class UnknownState(PlexError, LookupError):
    """No State (or no copy of that version) by that name in this store."""

    def __init__(self, key: str, version: int | None = None):
        what = key if version is None else f"{key} version {version}"
        super().__init__(f"no State {what} in this store")
        self.key, self.version = key, version


@dataclass(frozen=True)
class MoveResult:
    """One finished transition: ``num_bytes`` copied in ``seconds`` (the copy alone)."""

    key: str
    src: Tier
    dst: Tier
    version: int          #: version of the new current copy
    num_bytes: int        #: bytes copied (0 for a State rebuilt from DROPPED)
    seconds: float        #: wall seconds of the copy (of writing or reading the file)
    checksum: str = ""    #: spill and restore: xxh3_64 of the bytes written / verified


@dataclass(frozen=True)
class CopyInfo:
    """One copy of a State: where, which version, whether it is the current one."""

    tier: Tier
    version: int
    num_bytes: int
    current: bool


@dataclass(frozen=True)
class StoreStats:
    """Bytes per tier and copies, at one moment."""

    device: DeviceStats
    host_used_bytes: int        #: every copy on HOST, current and older
    host_pooled_bytes: int      #: free HOST buffers kept for reuse
    host_num_allocated: int     #: HOST buffers ever created by this process
    num_states: int
    num_copies: int             #: current + older copies, all tiers
    num_older: int              #: older (read-only) copies not yet released
    disk_used_bytes: int = 0    #: every spill file (every copy on DISK)
    disk_num_files: int = 0
