"""Reading a running controller by name, for commands that attach to one (``plexrl trace``).

Owns: choosing the cluster and the controller (those ``plexrl up`` recorded in the run
directory unless given; ``runtime.head`` joins the cluster and finds the actor), and asking
it for records by name (``Controller.inspect``); a missing cluster or controller is a
``ConfigError`` that says how to start one. In a process already on a Ray cluster (tests),
that cluster is used. Must not know: what the records mean, or what the command does.
"""

from __future__ import annotations

import sys

from plexrl.errors import ConfigError
from plexrl.runtime import head


def inspect_named(whats: tuple[str, ...], *, controller: str | None = None,
                  address: str | None = None) -> dict:
    """``{what: controller.inspect(what)}`` of the named (or ``plexrl up``'s) controller."""
    state = head.read_state()
    joined = "ray" in sys.modules and sys.modules["ray"].is_initialized()
    if not joined:   # ray is imported only now: connect_ray sets its authentication first
        address = address or (state.address if state else None)
        if address is None:
            raise ConfigError("no running PlexRL to attach to", field="address", value=None,
                              fix="start one with `plexrl up`, or pass --address")
        head.connect_ray(address)
    import ray
    name = controller or (state.controller if state else head.CONTROLLER_NAME)
    handle = head.find_controller(name)
    if handle is None:
        raise ConfigError(f"no controller named {name!r} in namespace plexrl",
                          field="controller", value=name,
                          fix="start one with `plexrl up`, or pass --controller NAME")
    return dict(zip(whats, ray.get([handle.inspect.remote(w) for w in whats])))
