"""The ``plexrl`` command line (not yet written).

Will own: the ``plexrl ...`` subcommands (demo, sim, up, submit, status, down) and their
argument parsing. Heavy modules (the simulator, the runtime, ray, torch) are imported lazily
inside the command that needs them, so ``plexrl --help`` is instant.
"""
