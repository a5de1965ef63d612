"""What a job imports (not yet written).

Will own: a few verbs (generate, logprobs, forward_backward, optim_step, sync_weights, ...)
that return futures, in order, each with an ``_async`` twin, over an injectable
``Transport`` (Ray in production, the simulator, or a mock built from a plain function in
tests) found through a registry. Imports only the vocabulary (``plexrl.protocol``,
``plexrl.config``, ``plexrl.errors``) and the standard library: never the runtime, the
simulator, ray or torch.
"""
