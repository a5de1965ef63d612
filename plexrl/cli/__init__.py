"""The ``plexrl`` command line.

Owns the ``plexrl ...`` subcommands (``demo``; ``sim``; the team service's ``up``, ``down``,
``status``, ``jobs``, ``submit``, ``logs``, ``cancel``; ``trace``) and their argument parsing.
Heavy modules (the simulator, the runtime, ray, torch) are imported lazily inside the command
that needs them, so ``plexrl --help`` is instant.
"""
