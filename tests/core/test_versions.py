"""Weight versions order a job's two copies: a sync waits for the trainer to reach its version."""

from __future__ import annotations

from core_builders import admitted, cluster, key, queue, rl_job, with_tiers

from plexrl.core import plan
from plexrl.core.decisions import Dispatch
from plexrl.core.planner import runnable
from plexrl.protocol import Copy, Function, State, Tier


def _sync_queued(trainer_version: int):
    clus = cluster({"g0": (1, ("n0",)), "g1": (1, ("n0",))}, {"n0": 1e9})
    snap = admitted(clus, rl_job("a", 50, "g0", "g1"))
    rollout_w, trainer_w = key("a", State.WEIGHTS, Copy.ROLLOUT), key("a", State.WEIGHTS)
    snap = with_tiers(snap, {rollout_w: Tier.DEVICE}, versions={trainer_w: trainer_version})
    return queue(snap, 1, "a", 0, Function.SYNC_WEIGHTS, version=1)


def test_a_sync_waits_until_the_trainer_has_the_version_it_installs():
    waiting = _sync_queued(trainer_version=0)
    assert runnable(waiting, "g1") == [] and plan(waiting, 0.0) == []
    ready = _sync_queued(trainer_version=1)
    assert [type(d) for d in plan(ready, 0.0)] == [Dispatch]
