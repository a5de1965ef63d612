"""The wall-clock driver of the core on Ray (not yet written).

Will own: the controller actor that feeds events to ``plexrl.core`` with ``time.monotonic()``
and hands its decisions to one executor; one service actor per worker group, reserved with
Ray placement groups; the state manager that really moves tensors between device, host and
disk; and the engines that run models. The only subpackage that may import ray, and (with
``plexrl.losses``) the only one that may import torch. Must not import ``plexrl.sim`` or
``plexrl.rl``.
"""
