"""PlexRL: a cluster-level runtime that time-slices LLM services across RLVR jobs.

The package is layered (see docs/design.md and ../shared/DESIGN.md):

- ``protocol``, ``config``, ``errors``: the vocabulary, stdlib only.
- ``core``: the pure scheduling brain, ``plan(snapshot, now) -> list[Decision]``.
- ``sim``: drives the core with a virtual clock (modelled calls, transfers, jobs).
- ``runtime``: drives the core with the wall clock on Ray, running real models.
- ``client``: what a job imports: ``plexrl.connect()`` and the verbs.
- ``timeline``: a stdlib-only Chrome-trace/Perfetto writer shared by every driver.
- ``cli``: the ``plexrl`` command.
"""

__version__ = "0.1.0"


def connect(address: str | None = None, **options):
    """Connect to a runtime (the embedded local one by default); see ``plexrl.client``."""
    from plexrl.client import connect as _connect
    return _connect(address, **options)
