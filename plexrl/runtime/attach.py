"""Reading a running controller by name, for commands that attach to one (``plexrl trace``).

Owns: joining the Ray cluster at an address (in namespace ``plexrl``), finding the named
controller there, and asking it for records by name (``Controller.inspect``); a missing
cluster or controller is a ``ConfigError`` that says how to start one.
Must not know: what the records mean, or what the command does with them.
"""

from __future__ import annotations

import ray

from plexrl.errors import ConfigError
from plexrl.runtime.transport import NAMESPACE

DEFAULT_CONTROLLER = "plexrl-controller"


def inspect_named(whats: tuple[str, ...], *, controller: str = DEFAULT_CONTROLLER,
                  address: str = "auto") -> dict:
    """``{what: controller.inspect(what)}`` of the controller named ``controller``."""
    if not ray.is_initialized():
        try:
            ray.init(address=address, namespace=NAMESPACE, logging_level="WARNING",
                     log_to_driver=False)
        except (ConnectionError, RuntimeError) as err:
            raise ConfigError(f"no Ray cluster to attach to at {address!r} ({err})",
                              field="address", value=address,
                              fix="start one with `plexrl up`, or pass --address") from None
    try:
        handle = ray.get_actor(controller, namespace=NAMESPACE)
    except ValueError:
        raise ConfigError(f"no controller named {controller!r} in namespace {NAMESPACE!r}",
                          field="controller", value=controller,
                          fix="start one with `plexrl up`, or pass --controller NAME") from None
    return dict(zip(whats, ray.get([handle.inspect.remote(w) for w in whats])))
