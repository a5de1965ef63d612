"""RLVR algorithms (GRPO and friends), verifiable tasks and rewards (not yet written).

Will own: the control logic a job keeps (data, rewards, tools, the algorithm loop), written
only against ``plexrl.client``. Must not import ``plexrl.runtime``, ``plexrl.sim``, ray or
torch, so the same algorithm runs on Ray, in the simulator, or on a mock transport.
"""
