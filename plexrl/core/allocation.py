"""Cluster admission: cut worker groups from free devices, share pools, queue and backfill jobs.

Owns: the admission order of pending jobs (priority, then first come first served), placing a
job whose copies ask for pools (``JobSpec.pools``) by cutting groups from free devices
(``carve``) or binding a copy to a shareable group of its pool class, the placement strategy
(a copy that may share joins a group of its pool class with room before a new group is cut:
``spread`` picks the one with the fewest jobs, ``pack`` the one with the most), and EASY backfilling: while the
first waiting job cannot start, a later one may start if it ends before the first one's
reservation or leaves it enough devices. Jobs with static ``candidates`` are placed by
``placement.admit``. Must not know: clocks, drivers, how jobs run.
"""

from __future__ import annotations

from dataclasses import dataclass

from plexrl.core import ledger
from plexrl.core.cluster import WorkerGroupSpec
from plexrl.core.decisions import Decision, Place, Reject
from plexrl.core.jobs import JobSpec, PoolRequest, device_bytes_needed, pinned_to_host, state_bytes, states_of
from plexrl.core.placement import admit
from plexrl.core.snapshot import Snapshot
from plexrl.core.usage import host_room
from plexrl.protocol import Copy, NodeId, WorkerGroupId

GiB = 2**30
Carve = tuple[tuple[NodeId, ...], int]     #: (nodes, devices) of one group to cut


@dataclass(frozen=True)
class Placement:
    """A job's Place decisions, and the devices its new groups take."""

    places: tuple[Place, ...]
    carves: tuple[Carve, ...]


def admit_pending(snap: Snapshot, now: float) -> tuple[Snapshot, list[Decision]]:
    """Admit what can start now, in order; assume each decision into the returned snapshot."""
    decisions: list[Decision] = []
    order = sorted(snap.pending, key=lambda s: -s.priority) if any(
        s.priority for s in snap.pending) else list(snap.pending)
    cache: dict[str, Placement | Reject | None] = {}
    head: _Reservation | None = None
    for spec in order:
        if not spec.pools:
            found = admit(snap, spec)
            for decision in found:
                snap = ledger.assume(snap, decision, now)
            decisions += found
            continue
        sig = spec.placement_key
        if sig not in cache:
            cache[sig] = place_pooled(snap, spec)
        result = cache[sig]
        if isinstance(result, Reject):
            result = Reject(job=spec.job, reason=result.reason.replace("{job}", spec.job))
            snap = ledger.assume(snap, result, now)
            decisions.append(result)
            continue
        if result is None:
            if not snap.config.backfill:
                break
            if head is None:
                head = _reserve(snap, spec, now)
            continue
        if head is not None and not head.allows(snap, spec, sig, result, now):
            continue
        placed = _named(result, spec)
        for decision in placed.places:
            snap = ledger.assume(snap, decision, now)
        decisions += placed.places
        if head is not None:
            head.taken(spec, placed, now)
        cache.clear()
    return snap, decisions


def place_pooled(snap: Snapshot, spec: JobSpec) -> Placement | Reject | None:
    """Where a pooled job's copies go now; a Reject when they never could; None when no room.

    Group ids in the result are provisional (``{job}`` placeholders) so that the result can be
    reused for another job with the same requests; ``_named`` fills them in.
    """
    never = _never_fits(snap, spec)
    if never:
        return Reject(job=spec.job, reason=never)
    free = dict(snap.free_devices)
    places: list[Place] = []
    carves: list[Carve] = []
    bound: dict[tuple, WorkerGroupId] = {}
    for req in _ordered(spec.pools):
        if req.same_as is not None:
            wg = bound[req.same_as]
            places.append(Place(job=spec.job, role=req.role, copy=req.copy, wg=wg))
            bound[(req.role, req.copy)] = wg
            continue
        decl = spec.model(req.role)
        shared = [g for g in _shareable(snap, req) if _fits_existing(snap, spec, req, g)]
        if not shared:
            pick = None
        elif snap.config.placement == "pack":
            pick = max(shared, key=lambda g: (snap.num_bound_jobs[g], g))
        else:
            pick = min(shared, key=lambda g: (snap.num_bound_jobs[g], g))
        if pick is not None:
            places.append(Place(job=spec.job, role=req.role, copy=req.copy, wg=pick))
            bound[(req.role, req.copy)] = pick
            continue
        nodes = carve(free, snap, req.num_devices)
        if nodes is None or not _host_room_for(snap, decl, req, nodes):
            return None
        for node in nodes:
            free[node] -= req.num_devices // len(nodes)
        wg = WorkerGroupId(f"{{job}}/{req.role}-{req.copy}")
        group = WorkerGroupSpec(wg, nodes, req.num_devices, req.purpose, req.pool, carved=True)
        places.append(Place(job=spec.job, role=req.role, copy=req.copy, wg=wg, carve=group))
        carves.append((nodes, req.num_devices))
        bound[(req.role, req.copy)] = wg
    return Placement(tuple(places), tuple(carves))


def _named(p: Placement, spec: JobSpec) -> Placement:
    def name(wg: WorkerGroupId) -> WorkerGroupId:
        return WorkerGroupId(wg.replace("{job}", spec.job))
    places = []
    for place in p.places:
        carve_spec = place.carve
        if carve_spec is not None:
            carve_spec = WorkerGroupSpec(name(carve_spec.wg), carve_spec.nodes, carve_spec.num_devices,
                                         carve_spec.purpose, carve_spec.pool, carved=True)
        places.append(Place(job=spec.job, role=place.role, copy=place.copy, wg=name(place.wg),
                            carve=carve_spec))
    return Placement(tuple(places), p.carves)


def _ordered(pools: tuple[PoolRequest, ...]) -> list[PoolRequest]:
    """Requests with a ``same_as`` after the one they name."""
    return sorted(pools, key=lambda r: r.same_as is not None)


def carve(free: dict[NodeId, int], snap: Snapshot, num_devices: int) -> tuple[NodeId, ...] | None:
    """Nodes to cut a group of ``num_devices`` from: best fit inside one node, or whole free nodes."""
    size = snap.cluster.node_size
    if num_devices <= size:
        fitting = [(f, n) for n, f in free.items() if f >= num_devices]
        return (min(fitting)[1],) if fitting else None
    if num_devices % size:
        return None
    nodes = snap.cluster.nodes
    whole = sorted(n for n, f in free.items() if f == size == nodes[n].num_devices)
    count = num_devices // size
    return tuple(whole[:count]) if len(whole) >= count else None


def _shareable(snap: Snapshot, req: PoolRequest) -> list[WorkerGroupId]:
    if not req.pool:
        return []
    return sorted(g.wg for g in snap.cluster.worker_groups.values()
                  if g.carved and g.pool == req.pool and g.num_devices == req.num_devices
                  and snap.num_bound_jobs[g.wg] < snap.config.max_tenants)


def _fits_existing(snap: Snapshot, spec: JobSpec, req: PoolRequest, wg: WorkerGroupId) -> bool:
    """The copy's largest call fits the group's memory and its pinned States the host room."""
    decl = spec.model(req.role)
    usable = snap.cluster.device_of(wg).usable_bytes
    group = snap.cluster.worker_groups[wg]
    if device_bytes_needed(decl, req.copy, group.num_devices, usable) > snap.cluster.device_budget(wg):
        return False
    pinned = _pinned(decl, req, usable)
    return not pinned or pinned <= host_room(snap, wg)


def _pinned(decl, req: PoolRequest, usable: float) -> int:
    return sum(state_bytes(decl, req.copy, s, req.num_devices, usable)
               for s in states_of(decl, req.copy) if pinned_to_host(decl, s))


def _host_room_for(snap: Snapshot, decl, req: PoolRequest, nodes: tuple[NodeId, ...]) -> bool:
    usable = snap.cluster.nodes[nodes[0]].device.usable_bytes
    if not _pinned(decl, req, usable):
        return True
    room = min(snap.cluster.nodes[n].host_bytes - snap.host_bytes_on(n) for n in nodes) * len(nodes)
    return _pinned(decl, req, usable) <= room


def _never_fits(snap: Snapshot, spec: JobSpec) -> str:
    """Why a job could not start even on an empty cluster; empty when it could."""
    total, node_size = snap.cluster.total_devices, snap.cluster.node_size
    node = next(iter(snap.cluster.nodes.values()))
    usable = node.device.usable_bytes
    need_total = sum(r.num_devices for r in spec.pools if r.same_as is None)
    problems = []
    if need_total > total:
        problems.append(f"asks for {need_total} devices but the cluster has {total}")
    for req in spec.pools:
        decl = spec.model(req.role)
        if req.same_as is not None:
            req = PoolRequest(req.role, req.copy, _size_of(spec, req.same_as))
        unit = decl.spec.rollout_tp if req.copy == Copy.ROLLOUT else decl.spec.replica_devices
        where = f"{req.role} {req.copy} pool of {req.num_devices} devices"
        if req.num_devices < 1 or req.num_devices % unit:
            problems.append(f"{where} does not divide into instances of {unit} devices")
        elif req.num_devices > node_size and req.num_devices % node_size:
            problems.append(f"{where} is neither within one node nor whole nodes of {node_size}")
        need = device_bytes_needed(decl, req.copy, req.num_devices, usable)
        if need > usable * req.num_devices:
            problems.append(f"{where} needs {need / GiB:.1f} GiB of device memory but has "
                            f"{usable * req.num_devices / GiB:.1f} GiB")
    if not problems:
        return ""
    return (f"job {{job}} cannot run on this cluster: {'; '.join(problems)}. Fix: ask for "
            f"fewer or whole-node pools, more parallelism, or a smaller model")


def _size_of(spec: JobSpec, target: tuple) -> int:
    return next(r.num_devices for r in spec.pools if (r.role, r.copy) == tuple(target))


class _Reservation:
    """EASY backfilling: when the first waiting job (the head) can start, and what it needs then."""

    def __init__(self, shadow_s: float, free_at_shadow: dict[NodeId, int] | None,
                 head_need: tuple[int, ...]):
        self.shadow_s = shadow_s
        self.free_at_shadow = free_at_shadow
        self.head_need = head_need
        self._leaves_room: dict[str, bool] = {}   #: per placement key, until the next start

    def allows(self, snap: Snapshot, spec: JobSpec, key: str, p: Placement, now: float) -> bool:
        """Start ``spec`` now only if it ends before the shadow time or leaves the head room."""
        if self.free_at_shadow is None or now + spec.expected_s <= self.shadow_s:
            return True
        if key not in self._leaves_room:
            self._leaves_room[key] = _fits_all(self._without(p), snap, self.head_need)
        return self._leaves_room[key]

    def taken(self, spec: JobSpec, p: Placement, now: float) -> None:
        self._leaves_room.clear()
        if self.free_at_shadow is not None and now + spec.expected_s > self.shadow_s:
            self.free_at_shadow = self._without(p)

    def _without(self, p: Placement) -> dict[NodeId, int]:
        free = dict(self.free_at_shadow)
        for nodes, devices in p.carves:
            for node in nodes:
                free[node] -= devices // len(nodes)
        return free


def _head_need(snap: Snapshot, spec: JobSpec) -> tuple[int, ...]:
    """Devices of the groups the head must cut (shareable pools with room now cost none)."""
    need = []
    for req in spec.pools:
        if req.same_as is None and not any(_fits_existing(snap, spec, req, g) for g in _shareable(snap, req)):
            need.append(req.num_devices)
    return tuple(sorted(need, reverse=True))


def _fits_all(free: dict[NodeId, int], snap: Snapshot, need: tuple[int, ...]) -> bool:
    work = dict(free)
    for devices in need:
        nodes = carve(work, snap, devices)
        if nodes is None:
            return False
        for node in nodes:
            work[node] -= devices // len(nodes)
    return True


def _reserve(snap: Snapshot, head: JobSpec, now: float) -> _Reservation:
    """The head's shadow time: the first expected release after which its groups can be cut."""
    need = _head_need(snap, head)
    ends: dict[WorkerGroupId, float] = {}
    for job in snap.jobs.values():
        end = job.expected_end
        for wg in set(job.bindings.values()):
            if snap.cluster.worker_groups[wg].carved:
                ends[wg] = max(ends.get(wg, now), end)
    free = dict(snap.free_devices)
    total_free, total_need = sum(free.values()), sum(need)
    releases = sorted((e, w) for w, e in ends.items() if e != float("inf"))
    for i, (end, wg) in enumerate(releases):
        group = snap.cluster.worker_groups[wg]
        for node, devices in group.devices_per_node(snap.cluster.nodes).items():
            free[node] += devices
        total_free += group.num_devices
        last_at_this_time = i + 1 == len(releases) or releases[i + 1][0] > end
        if last_at_this_time and total_free >= total_need and _fits_all(free, snap, need):
            return _Reservation(max(end, now), free, need)
    return _Reservation(float("inf"), None, need)
