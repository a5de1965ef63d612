"""Independent simulations spread over the machine's cores.

Owns: ``map_runs`` (a function over a list of arguments, results in the order given, in up to
two worker processes). Every simulation is a pure function of its arguments (the scenario
and the seed), so where it runs never changes its result. Must not know: what is simulated.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

#: At most this many processes: the CI machine and the laptop the README assumes have two cores.
MAX_WORKERS = 2


def map_runs(fn: Callable[..., Any], runs: Sequence[tuple], max_workers: int | None = None) -> list:
    """``[fn(*args) for args in runs]``, over worker processes when there are two or more cores."""
    workers = min(MAX_WORKERS if max_workers is None else max_workers, os.cpu_count() or 1, len(runs))
    if workers <= 1:
        return [fn(*args) for args in runs]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_call, [(fn, args) for args in runs]))


def _call(job: tuple) -> Any:
    fn, args = job
    return fn(*args)
