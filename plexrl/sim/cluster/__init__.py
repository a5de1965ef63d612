"""The cluster-level replay: a trace of jobs arriving over days, under placement strategies.

Owns: trace jobs and offered load (``trace.py``), a deterministic generator of synthetic
traces (``tracegen.py``), the replay itself, in which the core admits, places and backfills
at every arrival and finish while each pool steps at the rate the call-level simulation
measured for its composition (``replay.py``), and the report of a trace scenario
(``trace_report.py``).

May import ``plexrl.sim.experiments`` for step rates. Must not know: Ray, torch, wall clocks.
"""
