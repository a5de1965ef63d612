"""The virtual-clock driver of the core (``plexrl sim``), in two rooms:

- ``experiments/``: the call-level simulation of one experiment, a few jobs in one
  deployment mode, call by call: workload models, the event loop and its fake cluster,
  GPU-second accounting, the sizing search, the paper-e2e report, sweeps, the queue-policy
  study, and replaying a measured runtime run;
- ``cluster/``: the cluster-level replay of a trace of jobs arriving over days under
  placement strategies, each pool's step rate taken from the call-level simulation.

``scenario.py`` here is the file schema both read. ``cluster`` may import ``experiments``,
never the reverse (``.importlinter``, "sim rooms").
"""
