"""Cluster admission: groups cut from free devices, shared pools, FCFS, EASY backfill, release."""

from __future__ import annotations

from dataclasses import replace

import pytest

from plexrl.core import apply, assume, plan
from plexrl.core import events as ev
from plexrl.core.cluster import ClusterSpec, NodeSpec, WorkerGroupSpec
from plexrl.core.decisions import Place, Reject
from plexrl.core.invariants import Invariant, check_decisions, check_snapshot
from plexrl.core.jobs import JobSpec, ModelDecl, PoolRequest
from plexrl.core.snapshot import CoreConfig, Snapshot
from plexrl.protocol import Copy, Role

from core_builders import BW, DEVICE, model


def nodes(count: int, size: int = 8, host: float = 1e9) -> ClusterSpec:
    return ClusterSpec({f"n{i}": NodeSpec(f"n{i}", size, DEVICE, host, 1e12, dict(BW)) for i in range(count)}, {})


def pooled(job: str, train: int, rollout: int, *, pool: str = "", steps: int = 0, step_s: float = 0.0,
           params: float = 10.0, priority: int = 0) -> JobSpec:
    """A job with a trainer copy on ``train`` devices (shareable when ``pool``) and a private rollout."""
    decl = ModelDecl(Role.POLICY, model(params), (Copy.TRAINER, Copy.ROLLOUT))
    pools = (PoolRequest(Role.POLICY, Copy.TRAINER, train, "train", pool),
             PoolRequest(Role.POLICY, Copy.ROLLOUT, rollout, "rollout"))
    return JobSpec(job=job, models=(decl,), candidates=(), pools=pools, num_steps=steps,
                   step_s=step_s, priority=priority)


def run(snap: Snapshot, now: float, *events) -> tuple[Snapshot, list]:
    """Fold events, plan once (checking every invariant), assume the decisions."""
    for event in events:
        snap = apply(snap, event)
    decisions = plan(snap, now)
    assert check_decisions(snap, decisions, now) == []
    for d in decisions:
        snap = assume(snap, d, now)
    assert check_snapshot(snap) == []
    return snap, decisions


def submit(*specs: JobSpec, at: float = 0.0):
    return [ev.JobSubmitted(spec=s, at=at) for s in specs]


def placed(decisions) -> list[str]:
    return list(dict.fromkeys(d.job for d in decisions if isinstance(d, Place)))


def test_groups_are_cut_from_free_devices_and_released_with_their_last_job():
    snap = Snapshot(cluster=nodes(2), config=CoreConfig())
    snap, decisions = run(snap, 0.0, *submit(pooled("a", 8, 4)))
    assert placed(decisions) == ["a"]
    assert sorted(snap.free_devices.values()) == [0, 4]        # 8 on one node, 4 on the other
    assert all(g.carved for g in snap.cluster.worker_groups.values())
    snap = apply(snap, ev.JobEnded(job="a", at=1.0))
    assert snap.cluster.worker_groups == {} and set(snap.free_devices.values()) == {8}
    assert apply(snap, ev.JobEnded(job="a", at=2.0)) == snap      # idempotent


def test_small_groups_best_fit_inside_one_node_and_large_ones_take_whole_nodes():
    snap = Snapshot(cluster=nodes(4), config=CoreConfig())
    snap, _ = run(snap, 0.0, *submit(pooled("a", 16, 2), pooled("b", 8, 6)))
    groups = {g.wg: g for g in snap.cluster.worker_groups.values()}
    big = next(g for g in groups.values() if g.num_devices == 16)
    assert len(big.nodes) == 2
    # the 6-device rollout of b went to the node a's 2-device rollout left 6 free on
    a_roll = next(g for g in groups.values() if g.num_devices == 2)
    b_roll = next(g for g in groups.values() if g.num_devices == 6)
    assert a_roll.nodes == b_roll.nodes


@pytest.mark.parametrize("placement, expect", [("spread", "c/policy-trainer"), ("pack", "a/policy-trainer")])
def test_spread_joins_the_least_shared_pool_and_pack_the_most(placement, expect):
    snap = Snapshot(cluster=nodes(4), config=CoreConfig(placement=placement, max_tenants=2))
    snap, _ = run(snap, 0.0, *submit(*(pooled(j, 8, 2, pool="t") for j in "abc")))
    assert snap.num_bound_jobs["a/policy-trainer"] == 2 and snap.num_bound_jobs["c/policy-trainer"] == 1
    snap = replace(snap, config=CoreConfig(placement=placement, max_tenants=3))
    snap, _ = run(snap, 0.0, *submit(pooled("d", 8, 2, pool="t")))
    assert snap.jobs["d"].bindings[(Role.POLICY, Copy.TRAINER)] == expect


def test_a_shareable_copy_joins_a_pool_before_cutting_a_new_one_and_respects_max_tenants():
    snap = Snapshot(cluster=nodes(4), config=CoreConfig(max_tenants=2))
    snap, _ = run(snap, 0.0, *submit(*(pooled(j, 8, 2, pool="t") for j in "abc")))
    trainers = [snap.jobs[j].bindings[(Role.POLICY, Copy.TRAINER)] for j in "abc"]
    assert trainers[0] == trainers[1] != trainers[2]


def test_fcfs_without_backfill_holds_later_jobs_behind_the_first_waiting_one():
    snap = Snapshot(cluster=nodes(2), config=CoreConfig(backfill=False))
    snap, _ = run(snap, 0.0, *submit(pooled("a", 8, 4, steps=10, step_s=10.0)))
    snap, decisions = run(snap, 1.0, *submit(pooled("big", 8, 8, steps=10, step_s=10.0),
                                             pooled("small", 2, 2, steps=1, step_s=1.0), at=1.0))
    assert placed(decisions) == [] and [s.job for s in snap.pending] == ["big", "small"]


def test_backfill_starts_a_job_that_ends_before_the_head_can_start():
    snap = Snapshot(cluster=nodes(2), config=CoreConfig(backfill=True))
    snap, _ = run(snap, 0.0, *submit(pooled("a", 8, 4, steps=10, step_s=10.0)))   # ends at ~100 s
    snap, decisions = run(snap, 1.0, *submit(pooled("big", 8, 8, steps=10, step_s=10.0),
                                             pooled("short", 2, 2, steps=5, step_s=10.0),
                                             pooled("long", 2, 2, steps=50, step_s=10.0), at=1.0))
    assert placed(decisions) == ["short"]                      # long would delay big past 100 s
    assert [s.job for s in snap.pending] == ["big", "long"]


def test_backfill_starts_a_long_job_that_leaves_the_head_its_devices():
    # 3 nodes: a holds node 0 (8) and 4 of node 1; big needs two nodes of 8, one of them free
    # only once a ends; a long 2+2 job fits in node 1's free 4 and leaves big nodes 0 and 2
    snap = Snapshot(cluster=nodes(3), config=CoreConfig(backfill=True))
    snap, _ = run(snap, 0.0, *submit(pooled("a", 8, 4, steps=10, step_s=10.0)))
    snap, decisions = run(snap, 1.0, *submit(pooled("big", 8, 8, steps=10, step_s=10.0),
                                             pooled("long", 2, 2, steps=99, step_s=10.0), at=1.0))
    assert placed(decisions) == ["long"]


def test_progress_moves_the_shadow_time():
    snap = Snapshot(cluster=nodes(2), config=CoreConfig(backfill=True))
    snap, _ = run(snap, 0.0, *submit(pooled("a", 8, 4, steps=10, step_s=10.0)))
    assert snap.jobs["a"].expected_end == pytest.approx(100.0)
    snap = apply(snap, ev.JobProgress(job="a", at=50.0, steps_done=2, step_s=20.0))
    assert snap.jobs["a"].expected_end == pytest.approx(50.0 + 8 * 20.0)
    snap, decisions = run(snap, 50.0, *submit(pooled("big", 8, 8, steps=10, step_s=10.0),
                                              pooled("mid", 2, 2, steps=12, step_s=10.0), at=50.0))
    assert placed(decisions) == ["mid"]     # ends at 170 s, before a's new end at 210 s


def test_priority_orders_the_queue():
    snap = Snapshot(cluster=nodes(1), config=CoreConfig(backfill=False))
    snap, decisions = run(snap, 0.0, *submit(pooled("low", 4, 4), pooled("high", 4, 4, priority=5)))
    assert placed(decisions) == ["high"]


def test_a_job_that_can_never_fit_is_rejected_with_sizes_and_a_fix_while_others_start():
    snap = Snapshot(cluster=nodes(2), config=CoreConfig())
    snap, decisions = run(snap, 0.0, *submit(pooled("huge", 16, 8), pooled("odd", 12, 2),
                                             pooled("ok", 4, 4)))
    rejects = {d.job: d.reason for d in decisions if isinstance(d, Reject)}
    assert "asks for 24 devices but the cluster has 16" in rejects["huge"]
    assert "neither within one node nor whole nodes of 8" in rejects["odd"]
    assert all("Fix:" in r for r in rejects.values())
    assert placed(decisions) == ["ok"] and snap.pending == ()


def test_memory_that_never_fits_is_rejected_in_gib():
    big = pooled("big", 1, 1, params=1000.0)    # trainer needs 18 x 1000 bytes on a 1000-byte device
    snap, decisions = run(Snapshot(cluster=nodes(1)), 0.0, *submit(big))
    reason = next(d.reason for d in decisions if isinstance(d, Reject))
    assert "device memory" in reason and "GiB" in reason


def test_a_cut_group_is_checked_against_node_capacity():
    clus = nodes(1).with_group(WorkerGroupSpec("x", ("n0",), 8, carved=True))
    assert check_snapshot(Snapshot(cluster=clus)) == []
    over = Snapshot(cluster=clus.with_group(WorkerGroupSpec("y", ("n0",), 4, carved=True)))
    assert [v.invariant for v in check_snapshot(over)] == [Invariant.NODE_CAPACITY]
    twice = Place(job="j", role=Role.POLICY, copy=Copy.TRAINER, wg="x",
                  carve=WorkerGroupSpec("x", ("n0",), 8, carved=True))
    assert [v.invariant for v in check_decisions(Snapshot(cluster=clus), [twice], 0.0)] == \
        [Invariant.NODE_CAPACITY]
