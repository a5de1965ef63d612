"""The service of one worker group: the process that runs its calls and holds its States.

Owns: the Ray actor's asyncio shell, where a job's call meets the controller's go
(``actor.py``); the service behind it, which checks each call's token and order
(``order.py``), runs it on an engine and moves States when told (``service.py``); the
PyTorch engine of one model (``engine.py``) and a simulated one with no torch
(``simulated.py``); what the service remembers of recent calls (``recent.py``); CPU cores of
their own for emulated devices (``cores.py``).

May import ``tiers`` and the runtime's settings and model sources. Must not know: the
controller, the core's decisions beyond the order it is handed, jobs' programs.
"""
