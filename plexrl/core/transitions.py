"""Transition planning: the Moves that make a call's States resident, within budgets.

Owns: which States a call needs (``needed_keys``), the expected switch-in time of a call
(``switch_in_s``), and ``make_resident``: evict (drop KV, offload others to HOST, spill to
DISK when host memory is short), restore, onload, rebuild. Moves are issued only when they
fit now; a transition counts at both ends until it finishes, so budgets hold at every
instant. The next plan, after the evictions land, issues the onloads. Must not know:
queue policies, clocks, how bytes move.
"""

from __future__ import annotations

from plexrl.core.costs import transfer_s
from plexrl.core.decisions import Move
from plexrl.core.jobs import needed_states, needs_base
from plexrl.core.snapshot import CallView, Snapshot, StateView
from plexrl.core.usage import device_free, host_room
from plexrl.protocol import CallId, State, StateKey, Tier, WorkerGroupId, base_key


def needed_keys(snap: Snapshot, call: CallView) -> tuple[StateKey, ...]:
    """The States a call needs on DEVICE: its copy's, and a LoRA model's shared base."""
    decl = snap.jobs[call.job].spec.model(call.role)
    own = tuple(StateKey(call.job, call.role, call.copy, s, call.lane)
                for s in needed_states(decl, call.function))
    return own + ((base_key(decl.spec.base, call.wg),) if needs_base(decl, call.function) else ())


def is_resident(view: StateView) -> bool:
    return view.tier == Tier.DEVICE and view.moving_to is None


def switch_in_s(snap: Snapshot, call: CallView) -> float:
    """Expected seconds before the call could start: restores, then onloads, of what is missing."""
    total = 0.0
    for key in needed_keys(snap, call):
        view = snap.states[key]
        if is_resident(view):
            continue
        if view.tier == Tier.DISK:
            total += transfer_s(snap, call.wg, Tier.DISK, Tier.HOST, view.num_bytes)
        src = Tier.DROPPED if view.tier == Tier.DROPPED else Tier.HOST
        total += transfer_s(snap, call.wg, src, Tier.DEVICE, view.num_bytes)
    return total


def make_resident(snap: Snapshot, wg: WorkerGroupId, keys: tuple[StateKey, ...],
                  workspace_bytes: int, protect: tuple[StateKey, ...], reason: str,
                  for_call: CallId | None = None) -> list[Move]:
    """Moves to start now toward having ``keys`` on DEVICE with ``workspace_bytes`` spare.

    ``protect`` are States that must stay (the running call's). Returns [] when nothing can
    start yet (in-flight transitions must land first, or no room can be made).
    """
    views = [snap.states[k] for k in keys]
    if any(v.moving_to is not None for v in views):
        return []  # wait for what is already moving
    missing = [v for v in views if v.tier != Tier.DEVICE]
    on_disk = [v for v in missing if v.tier == Tier.DISK]
    room = host_room(snap, wg)
    restoring, restore_bytes = [], 0
    for view in on_disk:  # restore what host memory holds now; the rest in a later round
        if restore_bytes + view.num_bytes <= room:
            restoring.append(view)
            restore_bytes += view.num_bytes
    if on_disk and not restoring:
        return _spill(snap, wg, on_disk[0].num_bytes - room, set(keys) | set(protect))
    restores = [_move(v, Tier.HOST, wg, "restore", for_call) for v in restoring]
    arriving = [v for v in missing if v.tier != Tier.DISK]
    need = sum(v.num_bytes for v in arriving) + workspace_bytes
    free = device_free(snap, wg)
    if need > free:
        return restores + _evict(snap, wg, need - free, set(keys) | set(protect), for_call,
                                 host_reserved=restore_bytes)
    moves = restores
    for v in arriving:
        src_reason = "rebuild" if v.tier == Tier.DROPPED else reason
        moves.append(_move(v, Tier.DEVICE, wg, src_reason, for_call))
    return moves


def _move(view: StateView, dst: Tier, wg: WorkerGroupId, reason: str,
          for_call: CallId | None) -> Move:
    return Move(key=view.key, src=view.tier, dst=dst, num_bytes=view.num_bytes, wg=wg,
                reason=reason, for_call=for_call)


def _evict(snap: Snapshot, wg: WorkerGroupId, shortfall: float, keep: set[StateKey],
           for_call: CallId | None, host_reserved: float = 0.0) -> list[Move]:
    """Evictions freeing at least ``shortfall`` bytes: KV caches (free to drop), then the
    largest States first, so few transitions pay the fixed latency; [] if impossible now."""
    victims = [s for s in snap.states_on(wg)
               if s.key not in keep and is_resident(s) and not s.pinned]
    victims.sort(key=lambda s: (s.key.state != State.KV_CACHE, -s.num_bytes, s.key))
    if sum(s.num_bytes for s in victims) < shortfall:
        return []
    moves: list[Move] = []
    freed, to_host = 0, 0
    for view in victims:
        if freed >= shortfall:
            break
        if view.key.state == State.KV_CACHE:
            moves.append(_move(view, Tier.DROPPED, wg, "evict", for_call))
        else:
            moves.append(_move(view, Tier.HOST, wg, "evict", for_call))
            to_host += view.num_bytes
        freed += view.num_bytes
    room = host_room(snap, wg) - host_reserved  # restores issued with these moves land on HOST too
    if to_host > room:
        return _spill(snap, wg, to_host - room, keep)
    return moves


def _spill(snap: Snapshot, wg: WorkerGroupId, shortfall: float, keep: set[StateKey]) -> list[Move]:
    """Host memory is short: spill parked States of this group's nodes to DISK, largest first."""
    parked = [s for g in snap.neighbours[wg] for s in snap.states_by_group[g].values()
              if s.tier == Tier.HOST and s.moving_to is None and not s.pinned
              and s.key not in keep]
    parked.sort(key=lambda s: (-s.num_bytes, s.key))
    moves, freed = [], 0
    for view in parked:
        if freed >= shortfall:
            break
        moves.append(_move(view, Tier.DISK, view.wg, "spill", None))
        freed += view.num_bytes
    return moves if freed >= shortfall else []
