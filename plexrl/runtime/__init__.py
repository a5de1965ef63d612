"""The wall-clock driver of the core on Ray.

Owns: the controller actor that feeds events to ``plexrl.core`` with ``time.monotonic()``
and hands its decisions to one executor (``controller.py``, ``executor.py``, ``jobs.py``);
one service actor per worker group, reserved with a Ray placement group, where a job's calls
meet the controller's go (``service_actor.py``, ``service.py``); the state storage that
really moves tensors between device, host and disk (``tiers.py``, ``device.py``,
``host.py``, ``disk.py``); the engine that runs Hugging Face models (``engine.py``,
``models.py``); the client's transport (``transport.py``); settings (``config.py``).
The only subpackage that may import ray, and (with ``plexrl.losses``) the only one that may
import torch. Must not import ``plexrl.sim`` or ``plexrl.rl``.
"""
