"""Cores of their own for emulated devices: without CUDA a service computes on CPU cores,
and the host side (drivers, controller, copies, Ray) must not share them, as it does not
share a GPU's (docs/design.md, D181).

Owns: ``reserve`` (keep this process, and what it starts from now on, off the last cores of
the machine, and name those) and ``pin_thread``. Must not know: Ray, services, scheduling.
"""

from __future__ import annotations

import os


def reserve(num: int) -> tuple[int, ...]:
    """Set ``num`` cores aside for devices: the last ones this process may run on, if it has
    more than ``num``. The calling thread, and the threads and processes it starts after
    (the embedded Ray cluster, if started after this), keep to the other cores.
    Returns the reserved cores; ``()`` when the machine has none to spare."""
    cores = sorted(os.sched_getaffinity(0))
    if num < 1 or len(cores) <= num:
        return ()
    os.sched_setaffinity(0, cores[:-num])
    return tuple(cores[-num:])


def pin_thread(cores: tuple[int, ...]) -> None:
    """Run the calling thread (and the threads it starts, torch's included) on ``cores``."""
    if cores:
        os.sched_setaffinity(0, cores)
