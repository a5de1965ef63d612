"""Test-suite set-up: hypothesis profiles and offline defaults for Ray and Hugging Face.

Profiles (pick with ``HYPOTHESIS_PROFILE``, default ``dev``):

- ``ci``: derandomized (a fixed seed, so CI failures reproduce), 60 examples per test,
  and the reproduction blob printed on failure;
- ``dev``: 30 random examples per test, for a quick local loop.

Neither has a deadline: the simulator's first call can be slow on a cold machine.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

settings.register_profile("ci", deadline=None, derandomize=True, max_examples=60,
                          print_blob=True)
settings.register_profile("dev", deadline=None, max_examples=30)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray cluster for the whole test session: loopback, 64 emulated devices."""
    import ray

    from plexrl.runtime.transport import init_local
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    if not ray.is_initialized():
        init_local(num_devices=64, num_cpus=2)
    yield
    ray.shutdown()
