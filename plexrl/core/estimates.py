"""What the core has learned from finished calls and transitions: moving averages.

Owns: ``Estimates``, the EMA tables of transfer bandwidth per (node, direction) and of
service time per (job, function), which the Snapshot carries and ``costs.py`` reads. Must
not know: where observations come from, or any clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from plexrl.core.cluster import Direction
from plexrl.protocol import Function, JobId, NodeId


@dataclass(frozen=True)
class Estimates:
    """Exponential moving averages learned from finished calls and transitions."""

    bytes_per_s: dict[tuple[NodeId, Direction], float] = field(default_factory=dict)
    service_s: dict[tuple[JobId, Function], float] = field(default_factory=dict)

    def observe_transfer(self, node: NodeId, direction: Direction, bytes_per_s: float,
                         alpha: float) -> "Estimates":
        table = dict(self.bytes_per_s)
        old = table.get((node, direction))
        table[(node, direction)] = bytes_per_s if old is None else old + alpha * (bytes_per_s - old)
        return replace(self, bytes_per_s=table)

    def observe_service(self, job: JobId, function: Function, seconds: float,
                        alpha: float) -> "Estimates":
        table = dict(self.service_s)
        old = table.get((job, function))
        table[(job, function)] = seconds if old is None else old + alpha * (seconds - old)
        return replace(self, service_s=table)
