"""Preflight: prove every experiment can be placed before anything is simulated.

Owns: running the core's own admission (``core.placement.admit``) on every layout the
scenario will try (each mode, each size choice) and turning a ``Reject`` into a
``ConfigError`` that names the scenario file, the sizes field, the value and the fix.
Must not know: how layouts are simulated.
"""

from __future__ import annotations

from plexrl.core import ledger
from plexrl.core.decisions import Reject
from plexrl.core.events import JobSubmitted
from plexrl.core.placement import admit
from plexrl.core.snapshot import Snapshot
from plexrl.errors import ConfigError
from plexrl.protocol import Copy, Role
from plexrl.sim.experiments.experiment import candidates, fixed_sizes
from plexrl.sim.experiments.modes import FLEET_MODES, Sizes, build_layout
from plexrl.sim.scenario import Scenario

ROLLOUT_FIELD = {"colocated": "colocated_gpus", "split-async": "split_rollout_gpus",
                 "plexrl": "plexrl_private_gpus", "plexrl-on-policy": "plexrl_private_gpus",
                 "plexrl-shared": "fleet_gpus", "plexrl-shared-on-policy": "fleet_gpus"}
CHOICES_FIELD = {"colocated_gpus": "colocated_choices", "split_rollout_gpus": "split_rollout_choices",
                 "plexrl_private_gpus": "plexrl_private_choices", "fleet_gpus": "fleet_choices",
                 "shared_train_gpus": "shared_train_choices"}


def preflight(s: Scenario) -> None:
    """Raise ConfigError for the first layout in which some job's model fits no pool."""
    for exp in s.experiments.values():
        model = s.workloads[exp.workloads[0]].model
        table = s.sizes[model]
        for mode in s.modes:
            tried = candidates(s, mode, table, exp.workloads) if s.search_sizes else [fixed_sizes(table)]
            for sizes in tried:
                _check_layout(s, mode, exp.workloads, sizes, model)


def _check_layout(s: Scenario, mode: str, workloads: tuple[str, ...], sizes: Sizes, model: str) -> None:
    """Admit the layout's jobs one after another, as the simulation will."""
    layout = build_layout(s, mode, workloads, sizes, s.seed)
    snap = Snapshot(cluster=layout.cluster)
    for spec in layout.specs.values():
        snap = ledger.apply(snap, JobSubmitted(spec=spec, at=0.0))
        decisions = admit(snap, spec)
        for decision in decisions:
            if isinstance(decision, Reject):
                field, value = _size_field(s, mode, sizes, model, decision.reason)
                raise ConfigError(f"in mode {mode}, {decision.reason}", file=s.source,
                                  field=f"sizes.{model}.{field}", value=value)
            snap = ledger.assume(snap, decision, 0.0)
        if not decisions:
            raise ConfigError(f"in mode {mode}, job {spec.job} waits for host memory that the "
                              "other jobs of its worker groups hold", file=s.source,
                              field="cluster.host_bytes_per_node", value=s.cluster.host_bytes_per_node,
                              fix="give nodes more host memory or share a group with fewer jobs")
        _check_workspace(s, mode, snap, spec)


def _size_field(s: Scenario, mode: str, sizes: Sizes, model: str, reason: str) -> tuple[str, int]:
    """The sizes field (or its choices) whose value made a copy fit no group."""
    rollout = mode == "colocated" or f"{Copy.ROLLOUT} copy" in reason
    field = ROLLOUT_FIELD[mode] if rollout else \
        "shared_train_gpus" if mode in FLEET_MODES else "train_gpus"
    value = getattr(sizes, field)
    if value != getattr(fixed_sizes(s.sizes[model]), field):
        field = CHOICES_FIELD[field]  # the bad size came from the search's choices
    return field, value


def _check_workspace(s: Scenario, mode: str, snap: Snapshot, spec) -> None:
    """A training call must fit beside its own States: States + workspace <= device budget."""
    wg = snap.jobs[spec.job].bindings[(Role.POLICY, Copy.TRAINER)]
    budget = snap.cluster.device_budget(wg)
    states = sum(v.num_bytes for k, v in snap.states.items()
                 if k.job == spec.job and v.wg == wg and k.copy == Copy.TRAINER
                 and k.role == Role.POLICY and not v.pinned)
    if states + s.train_workspace_frac * budget > budget:
        raise ConfigError(f"in mode {mode}, the trainer States of {spec.job} "
                          f"({states / 2**30:.1f} GiB) leave less than train_workspace_frac of "
                          f"{wg}'s {budget / 2**30:.1f} GiB free", file=s.source,
                          field="train_workspace_frac", value=s.train_workspace_frac,
                          fix="lower train_workspace_frac or give the training group more devices")
