"""How the answers of a worker group's ranks combine into the group's one answer.

Owns: joining the ranks' rows of a GENERATE or LOGPROBS in rank order, merging one move done
on every rank (bytes summed, the slowest rank's time, any rank's error), and finding the
runtime's own error in Ray's wrapper. Must not know: how the ranks were started, or what a
call computes.
"""

from __future__ import annotations

import numpy as np

from plexrl.protocol import Function


def joined(function: Function, mine, theirs: list):
    """One result from the ranks' results: GENERATE and LOGPROBS rows end to end in rank
    order; every other call answers the same on every rank (the lead's)."""
    if function not in (Function.GENERATE, Function.LOGPROBS) or not theirs:
        return mine
    return {k: np.concatenate([v] + [t[k] for t in theirs])
            if isinstance(v, np.ndarray) and v.ndim >= 1 else v for k, v in mine.items()}


def merged_move(answers: list):
    """One move on every rank at once: its bytes are the ranks' sum, its time the slowest
    rank's; any rank's error is the move's."""
    for answer in answers:
        if isinstance(answer, Exception):
            return answer
    return {"seconds": max(a["seconds"] for a in answers),
            "num_bytes": sum(a["num_bytes"] for a in answers)}


def raise_first(answers: list) -> None:
    for answer in answers:
        if isinstance(answer, Exception):
            raise cause(answer)


def cause(err: Exception) -> Exception:
    """The runtime's own error inside Ray's wrapper."""
    inner = getattr(err, "cause", None)
    return inner if isinstance(inner, Exception) else err
