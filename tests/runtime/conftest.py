"""Runtimes started per test on the session's local Ray cluster (``ray_session``, tests/conftest.py).

The cluster runs on loopback with 64 emulated devices (``plexrl_device``); each runtime
(a controller and its service actors) is started by ``connect`` and closed after its test.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")


@pytest.fixture
def connect(ray_session):
    from plexrl.client import Runtime
    from plexrl.runtime.config import RuntimeConfig, WorkerGroupConfig
    from plexrl.runtime.transport import RayTransport
    opened = []

    def start(groups=(("wg0", 1),), **settings) -> Runtime:
        """``groups``: (name, devices) or (name, devices, purpose) each."""
        config = RuntimeConfig(worker_groups=tuple(WorkerGroupConfig(*g) for g in groups),
                               check_invariants=True, **settings)
        runtime = Runtime(RayTransport(config=config))
        opened.append(runtime)
        return runtime
    yield start
    for runtime in opened:
        runtime.close()
