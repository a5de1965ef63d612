"""What a service remembers of the calls it ran, so a repeated call is answered, not run again.

Owns: ``CallRecords``, keyed by call id ``(job, seq)``: the outcome of each recent call (its
result or error, and the small record the controller folds), bounded to the most recent
``limit`` calls; how many times each call id was really executed (every one ever, so a test
can show that none ran twice); and the per-model weight versions the calls made (trainer:
OPTIM_STEPs and LOADs; rollout: the version a SYNC_WEIGHTS installed), which a restarted
controller reads back. Must not know: Ray, torch, scheduling, what a call computes.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass

from plexrl.protocol import Copy, Function, copy_label


@dataclass(frozen=True)
class Outcome:
    result: object = None
    error: BaseException | None = None
    record: dict | None = None    #: what ``go`` answered the controller


class CallRecords:
    def __init__(self, limit: int = 256):
        self.limit = limit
        self._done: OrderedDict[tuple[str, int], Outcome] = OrderedDict()
        self.executions: Counter = Counter()
        self.versions: dict[tuple[str, str], dict[str, int]] = {}

    def get(self, job: str, seq: int) -> Outcome | None:
        return self._done.get((job, seq))

    def executed(self, job: str, seq: int) -> None:
        self.executions[(job, seq)] += 1

    def finished(self, request, outcome: Outcome) -> None:
        key = (request.job, request.seq)
        self._done[key] = outcome
        self._done.move_to_end(key)
        while len(self._done) > self.limit:
            self._done.popitem(last=False)
        if outcome.error is None:
            self._count_version(request, outcome.result)

    def _count_version(self, request, result) -> None:
        versions = self.versions.setdefault((request.job, str(request.role)),
                                            {"trainer": 0, "rollout": 0})
        if request.function == Function.OPTIM_STEP:
            versions["trainer"] += 1
        elif request.function == Function.LOAD:
            versions["trainer"] = request.version if request.version > versions["trainer"] \
                else versions["trainer"] + 1
        elif request.function == Function.SYNC_WEIGHTS:   # per lane: "rollout", "rollout#1"
            versions[copy_label(Copy.ROLLOUT, request.lane)] = request.version

    def forget(self, job: str) -> None:
        for key in [k for k in self._done if k[0] == job]:
            del self._done[key]
        for key in [k for k in self.versions if k[0] == job]:
            del self.versions[key]

    def of_job(self, job: str) -> dict[int, dict]:
        """The recent calls of ``job`` this service ran: seq -> the record ``go`` answered."""
        return {seq: outcome.record for (owner, seq), outcome in self._done.items()
                if owner == job and outcome.record is not None}

    def repeated(self) -> list[tuple[str, int]]:
        """Call ids executed more than once (must stay empty)."""
        return sorted(key for key, n in self.executions.items() if n > 1)
