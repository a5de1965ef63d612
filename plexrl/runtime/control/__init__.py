"""The control plane: the controller, its executor, its journal and its recovery.

Owns: the one Snapshot of the runtime and the plan / assume / act loop around
``plexrl.core.plan`` (``controller.py``, with one mixin per concern: sending calls and
folding their finish in ``dispatching.py``, carrying out Moves in ``moving.py``, how jobs end
in ``endings.py``, submitted jobs in ``submissions.py``, what may be read in
``inspection.py``); what it keeps per job and call (``jobs.py``); turning decisions into
actor calls on reserved worker groups (``executor.py``); its durable control state in SQLite
(``journal.py``) and picking up after a restart (``recovery.py``).

May import ``workers``, ``submitted``, ``observe`` and the runtime's settings. Must not know:
torch, how a call runs, or how bytes move between tiers (the services do that).
"""
