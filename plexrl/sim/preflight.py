"""Preflight: prove every experiment can be placed before anything is simulated.

Owns: running the core's own admission (``core.placement.admit``) on every layout the
scenario will try (each mode, each size choice) and turning a ``Reject`` into a
``ConfigError`` that names the scenario file, the sizes field, the value and the fix.
Must not know: how layouts are simulated.
"""

from __future__ import annotations

from plexrl.core.decisions import Reject
from plexrl.core.placement import admit
from plexrl.core.snapshot import Snapshot
from plexrl.errors import ConfigError
from plexrl.protocol import Copy
from plexrl.sim.experiment import candidates, fixed_sizes
from plexrl.sim.modes import Sizes, build_layout
from plexrl.sim.scenario import Scenario

ROLLOUT_FIELD = {"colocated": "colocated_gpus", "split-async": "split_rollout_gpus",
                 "plexrl": "plexrl_private_gpus", "plexrl-on-policy": "plexrl_private_gpus"}
CHOICES_FIELD = {"colocated_gpus": "colocated_choices", "split_rollout_gpus": "split_rollout_choices",
                 "plexrl_private_gpus": "plexrl_private_choices"}


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
    layout = build_layout(s, mode, workloads, sizes, s.seed)
    snap = Snapshot(cluster=layout.cluster)
    for spec in layout.specs.values():
        for decision in admit(snap, spec):
            if isinstance(decision, Reject):
                rollout = mode == "colocated" or f"{Copy.ROLLOUT} copy" in decision.reason
                field = ROLLOUT_FIELD[mode] if rollout else "train_gpus"
                value = getattr(sizes, field)
                if value != getattr(fixed_sizes(s.sizes[model]), field):
                    field = CHOICES_FIELD[field]  # the bad size came from the search's choices
                raise ConfigError(f"in mode {mode}, {decision.reason}", file=s.source,
                                  field=f"sizes.{model}.{field}", value=value)
