"""Scenario cross-field checks (plexrl/sim/scenario.py): an unknown name's fix lists the names
the scenario has, or says how to add the first when it has none."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from plexrl.errors import ConfigError
from plexrl.sim.scenario import load_scenario, validate

TINY = Path(__file__).resolve().parents[1] / "data" / "tiny-e2e.toml"


def test_an_unknown_workload_lists_the_scenario_s_workloads():
    s = load_scenario(str(TINY))
    name, e = next(iter(s.experiments.items()))
    bad = dataclasses.replace(s, experiments={name: dataclasses.replace(e, workloads=("nosuch",))})
    with pytest.raises(ConfigError) as info:
        validate(bad, str(TINY))
    assert info.value.field == f"experiments.{name}.workloads" and info.value.value == "nosuch"
    assert info.value.fix == "use one of " + ", ".join(sorted(s.workloads))


def test_an_unknown_workload_in_a_scenario_without_workloads_says_how_to_add_one():
    s = load_scenario(str(TINY))
    with pytest.raises(ConfigError) as info:
        validate(dataclasses.replace(s, workloads={}), str(TINY))
    assert info.value.field.startswith("experiments.") and info.value.value in s.workloads
    assert "use one of" not in info.value.fix and "[workloads.NAME]" in info.value.fix
