"""The controller's log of finished calls: newest last, the oldest dropped past a limit.

Owns: ``CallLog`` (a list that drops its oldest records in chunks once it holds more than
``limit``, and counts what it dropped) and ``read_since``, with which a reader that counts
the records it has read (metrics, the dashboard's tallies) takes exactly the new ones,
whether the log is a ``CallLog`` or a plain list. Must not know: what a call computed, or
scheduling.
"""

from __future__ import annotations


class CallLog(list):
    """Records in the order calls finished; at most ``limit`` plus a tenth of it kept."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit, self.dropped = limit, 0

    def append(self, record: dict) -> None:
        super().append(record)
        if len(self) > self.limit + self.limit // 10:   # drop in chunks: O(1) per append
            excess = len(self) - self.limit
            del self[:excess]
            self.dropped += excess


def read_since(log: list[dict], seen: int) -> tuple[list[dict], int]:
    """The records appended after the first ``seen`` ever (those still kept), and the
    count of records ever appended, to pass as ``seen`` next time."""
    dropped = getattr(log, "dropped", 0)
    return log[max(0, seen - dropped):], dropped + len(log)
