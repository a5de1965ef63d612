"""``plexrl demo``: several real RLVR jobs training at once on one shared worker group.

Modules: ``plan`` (the demo's jobs and their config hash; no runtime), ``runner`` (starts the
local runtime, drives the jobs shared or isolated, reads the call log), ``record`` (the
isolated baseline file: stamp, write, check), ``artifacts`` (reward curves, timeline).
The orchestration lives here, outside ``plexrl.rl`` (which must not import the runtime).
"""
