"""The numbered invariants of DESIGN.md section 5, in one checker.

Owns: ``Invariant`` (the numbers and names used in docs/design.md and in error messages),
``check_decisions`` (assume each decision of a plan and check it), ``check_snapshot`` (budgets
and single copies of one snapshot) and ``check_step`` (what may change between two
snapshots: versions only move forward). Tests run them after every cycle; a deliberately
broken planner is caught with the invariant it broke named. Must not know: drivers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from plexrl.core import ledger
from plexrl.core.decisions import Decision, Dispatch, Move, Place
from plexrl.core.planner import version_at_start
from plexrl.core.snapshot import Snapshot
from plexrl.core.transitions import is_resident, needed_keys
from plexrl.core.usage import device_used, host_used
from plexrl.errors import InvariantError
from plexrl.protocol import Function, State, StateKey

EPS_BYTES = 1.0


class Invariant(enum.IntEnum):
    SINGLE_COPY = 1        # each State has one current copy; a move starts from it, once
    DEVICE_BUDGET = 2      # a group's device bytes (States, arrivals, workspace) <= budget
    HOST_BUDGET = 3        # a node's host bytes (parked States, arrivals) <= host memory
    RESIDENT = 4           # a call runs only with its States on DEVICE, current, not moving
    ORDER = 5              # a job's calls on one model copy run in issue order
    ISOLATION = 6          # a call touches only its own job's States (and the LoRA base it reads)
    VERSION_FORWARD = 7    # a weight version only moves forward
    STALENESS = 8          # GENERATE of step k samples from version max(0, k - s) exactly
    AFFINITY = 9           # a call runs on its copy's bound group, one call at a time
    NODE_CAPACITY = 10     # worker groups never hold more devices of a node than it has


@dataclass(frozen=True)
class Violation:
    invariant: Invariant
    detail: str

    def __str__(self) -> str:
        return f"invariant {self.invariant.value} ({self.invariant.name}) broken: {self.detail}"


def check_snapshot(snap: Snapshot) -> list[Violation]:
    out = []
    for view in snap.states.values():
        if view.moving_to == view.tier:
            out.append(Violation(Invariant.SINGLE_COPY, f"{view.key} moving to its own tier"))
    for wg in snap.cluster.worker_groups:
        used, budget = device_used(snap, wg), snap.cluster.device_budget(wg)
        if used > budget + EPS_BYTES:
            out.append(Violation(Invariant.DEVICE_BUDGET, f"{wg} holds {used:.0f} > {budget:.0f} bytes"))
    for node, free in snap.free_devices.items():
        if free < 0:
            out.append(Violation(Invariant.NODE_CAPACITY, f"{node}: groups hold {-free} devices "
                                 f"more than it has"))
    for node, used in host_used(snap).items():
        if used > snap.cluster.nodes[node].host_bytes + EPS_BYTES:
            out.append(Violation(Invariant.HOST_BUDGET, f"{node} holds {used:.0f} host bytes"))
    for wg, call in (*snap.running.items(), *snap.behind.items()):
        for key in needed_keys(snap, call):
            if not is_resident(snap.states[key]):
                out.append(Violation(Invariant.RESIDENT, f"{key} left DEVICE while call {call.call} "
                                     f"runs or waits to run"))
    for wg, call in snap.behind.items():
        if wg not in snap.running:
            out.append(Violation(Invariant.AFFINITY, f"call {call.call} waits behind no call on {wg}"))
        elif device_used(snap, wg) - snap.running[wg].workspace_bytes + call.workspace_bytes \
                > snap.cluster.device_budget(wg) + EPS_BYTES:
            out.append(Violation(Invariant.DEVICE_BUDGET, f"call {call.call} behind on {wg} would "
                                 f"not fit when it starts"))
    return out


def check_decision(snap: Snapshot, decision: Decision) -> list[Violation]:
    """Violations of one decision against the snapshot it is made on."""
    if isinstance(decision, Move):
        view = snap.states.get(decision.key)
        if view is None or view.moving_to is not None or view.tier != decision.src:
            return [Violation(Invariant.SINGLE_COPY, f"move of {decision.key} from {decision.src} "
                              f"but its copy is {view and view.tier}, moving {view and view.moving_to}")]
        return []
    if isinstance(decision, Place) and decision.carve is not None \
            and decision.carve.wg in snap.cluster.worker_groups:
        return [Violation(Invariant.NODE_CAPACITY, f"{decision.carve.wg} cut twice")]
    if isinstance(decision, Dispatch):
        return _check_dispatch(snap, decision)
    return []


def _check_dispatch(snap: Snapshot, dec: Dispatch) -> list[Violation]:
    call = next((c for c in snap.queued if c.call == dec.call), None)
    if call is None:
        return [Violation(Invariant.ORDER, f"call {dec.call} dispatched but not queued")]
    out = []
    busy = dec.wg in snap.behind or (dec.wg in snap.running and not snap.config.pipeline)
    if dec.wg != call.wg or busy:
        out.append(Violation(Invariant.AFFINITY, f"call {call.call} of {call.job} bound to {call.wg} "
                             f"dispatched on {dec.wg} (busy: {busy})"))
    expected = snap.jobs[call.job].next_seq[call.copy_id]
    if call.seq != expected:
        out.append(Violation(Invariant.ORDER, f"{call.job} call seq {call.seq} before seq {expected}"))
    foreign = [k for k in dec.uses if k.job != call.job and k not in needed_keys(snap, call)]
    if foreign:
        out.append(Violation(Invariant.ISOLATION, f"call {call.call} of {call.job} uses {foreign[0]}"))
    for key in dict.fromkeys((*needed_keys(snap, call), *dec.uses)):
        view = snap.states.get(key)
        if view is None or not is_resident(view):
            out.append(Violation(Invariant.RESIDENT, f"call {call.call} dispatched with {key} on "
                                 f"{view and view.tier}, moving {view and view.moving_to}"))
    if call.function == Function.GENERATE:
        out.extend(_check_staleness(snap, call))
    if call.function == Function.SYNC_WEIGHTS:
        have = version_at_start(snap, call, StateKey(call.job, call.role, call.copy, State.WEIGHTS, call.lane))
        if call.version <= have:
            out.append(Violation(Invariant.VERSION_FORWARD, f"{call.job} SYNC_WEIGHTS installs "
                                 f"version {call.version} over version {have}"))
    return out


def _check_staleness(snap: Snapshot, call) -> list[Violation]:
    stale = snap.jobs[call.job].spec.staleness
    want = max(0, call.step - stale)
    have = version_at_start(snap, call, StateKey(call.job, call.role, call.copy, State.WEIGHTS, call.lane))
    if call.version != want or have != want:
        return [Violation(Invariant.STALENESS, f"{call.job} GENERATE step {call.step} wants version "
                          f"{want}, call says {call.version}, rollout weights are {have}")]
    return []


def check_step(before: Snapshot, after: Snapshot) -> list[Violation]:
    """What may change between two snapshots: weight versions only move forward."""
    out = []
    for key, view in after.states.items():
        old = before.states.get(key)
        if key.state == State.WEIGHTS and old is not None and view.version < old.version:
            out.append(Violation(Invariant.VERSION_FORWARD,
                                 f"{key} went from version {old.version} to {view.version}"))
    return out


def check_decisions(snap: Snapshot, decisions: list[Decision], now: float) -> list[Violation]:
    """Assume each decision in turn; every violation met on the way, budgets included."""
    out = []
    for decision in decisions:
        out.extend(check_decision(snap, decision))
        if out:
            return out
        snap = ledger.assume(snap, decision, now)
        out.extend(check_snapshot(snap))
    return out


def enforce(violations: list[Violation]) -> None:
    if violations:
        raise InvariantError(violations)


__all__ = ["Invariant", "Violation", "check_decisions", "check_snapshot", "check_step",
           "enforce"]
