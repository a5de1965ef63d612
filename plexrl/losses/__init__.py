"""Loss functions that an engine runs by name (not yet written).

Will own: the per-token losses of the RL algorithms (policy-gradient, clipped surrogate,
KL penalties), looked up by name so a job sends a name, not code. May import torch; is not
the runtime (no ray, no actors, no scheduling) and does not import ``plexrl.runtime``.
"""
