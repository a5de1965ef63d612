"""The demo's remote verifier: a TRL-style reward function that answers after a fixed latency.

Owns: ``remote_verifier(fn, latency_s)``, which wraps a reward function so that each call
(one per GENERATE round: the whole batch of completions) first waits ``latency_s`` seconds
in the calling driver thread, as a job does while a verifier service, a sandbox or a tool
answers, then returns ``fn``'s scores unchanged. The wait is part of the job: the same in an
isolated and in a shared run, declared in the plan and printed at start. While a job waits,
its worker group has none of its calls to run: that idle time is what sharing fills.
Must not know: the runtime, the client, how rewards are combined.
"""

from __future__ import annotations

import time

from plexrl.errors import ConfigError
from plexrl.rl.rewards import RewardFn


def remote_verifier(fn: RewardFn, latency_s: float) -> RewardFn:
    """``fn`` behind a round trip of ``latency_s`` seconds per call (0: no wait)."""
    if latency_s < 0:
        raise ConfigError("a latency is >= 0 seconds", field="verifier_s", value=latency_s)

    def verifier(**kwargs):
        if latency_s:
            time.sleep(latency_s)
        return fn(**kwargs)
    verifier.__name__ = getattr(fn, "__name__", "verifier")
    return verifier
