"""The ``plexrl`` command line.

Owns the ``plexrl ...`` subcommands (today: ``sim``) and their argument parsing. Heavy
modules (the simulator; later the runtime, ray, torch) are imported lazily inside the command
that needs them, so ``plexrl --help`` is instant.
"""
