"""The call-level simulation: one experiment's jobs, call by call, on a virtual clock.

Owns: the modelled work of a step (``workload.py``) and the driver of one job (``job.py``);
the event loop that runs ``plexrl.core.plan`` over a fake cluster (``loop.py``, with
``readiness.py`` keeping when each call became runnable); deployment modes as layouts
(``modes.py``); GPU-second accounting (``accounting.py``); one experiment in one mode and the
sizing search (``experiment.py``), proved placeable first (``preflight.py``); the paper-e2e
report, its sweep and its files (``report.py``, ``sweep.py``, ``artifacts.py``); the
queue-policy study (``queue_study.py``); and a runtime run's logs as a scenario replayed
(``from_run.py``, ``measured.py``).

Must not know: the cluster replay (``plexrl.sim.cluster``), Ray, torch, wall clocks.
"""
