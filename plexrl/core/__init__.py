"""The pure scheduling core: ``plan(snapshot, now) -> list[Decision]``.

Given an immutable Snapshot and the time, the core returns what to do; the ledger folds
events and assumed decisions into the next Snapshot. No clock, randomness, I/O, threads,
Ray or torch here (a test scans for them); drivers (``plexrl.sim``, ``plexrl.runtime``)
own time and effects.
"""

from plexrl.core.ledger import apply, assume
from plexrl.core.planner import plan

__all__ = ["apply", "assume", "plan"]
