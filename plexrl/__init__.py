"""PlexRL: a cluster-level runtime that time-slices LLM services across RLVR jobs.

The package is layered (see docs/design.md and ../shared/DESIGN.md):

- ``protocol``, ``config``, ``errors``: the vocabulary, stdlib only.
- ``core``: the pure scheduling brain, ``plan(snapshot, now) -> list[Decision]``.
- ``sim``: drives the core with a virtual clock (modelled calls, transfers, jobs).
- ``runtime``: drives the core with the wall clock on Ray, running real models.
- ``client``: what a job imports: ``plexrl.connect()`` and the verbs.
- ``rl``, ``losses``: RLVR on the client (tasks, rewards, tools, GRPO, PPO) and the losses
  the service computes.
- ``timeline``, ``trace_export``: a stdlib-only Chrome-trace/Perfetto writer shared by every
  driver, and the call log's export.
- ``cli``, ``demo``, ``config_docs``: the ``plexrl`` command, ``plexrl demo``, and the
  generated reference of every config field.

docs/architecture.md draws the layers and follows one call and one State move through them.
"""

__version__ = "0.1.0"


def connect(address: str | None = None, **options):
    """Connect to a runtime (the embedded local one by default); see ``plexrl.client``."""
    from plexrl.client import connect as _connect
    return _connect(address, **options)
