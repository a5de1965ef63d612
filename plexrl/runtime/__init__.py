"""The wall-clock driver of the core on Ray: the runtime that really runs jobs' models.

A call travels down through the rooms; no room imports one above it (``.importlinter``,
"runtime rooms"):

- the doors, here: ``transport.py`` (how a program's ``plexrl.connect()`` reaches the runtime:
  the embedded Ray cluster or a running one, and this connection's controller), ``head.py``
  (what ``plexrl up`` starts and ``plexrl down`` stops) and ``attach.py`` (reading a running
  controller by name);
- ``control/``: the controller, which feeds events to ``plexrl.core`` on the wall clock and
  hands every decision to the one executor; its journal and its recovery after a restart;
- ``submitted/``, ``observe/`` and ``tinker/``, beside each other under the controller: what
  a team submits (job files, the child process of a job's program), what an operator reads
  (metrics, the dashboard, the call log), and the Tinker API the official SDK talks to;
- ``workers/``: the service of one worker group, a Ray actor that runs the calls of every job
  bound to it on the PyTorch engine (or a simulated one) and moves their States;
- ``tiers/``: the State storage that really moves bytes between device, host and disk;
- the settings and model sources, here: ``config.py`` (``RuntimeConfig``) and ``models.py``
  (built-in tiny Hugging Face configs, local checkpoints, ``model_spec``), which every room
  may read.

The only package that may import ray, and (with ``plexrl.losses``) the only one that may
import torch. Must not import ``plexrl.sim`` or ``plexrl.rl``.
"""
