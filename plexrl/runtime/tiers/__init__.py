"""The State tiers: where each State's bytes live, and how they really move.

Owns: ``StateStore`` (``store.py``: per State one current copy and its older, read-only
ones; ``move`` copies the bytes between tiers), the DEVICE tier's byte budget and reused
buffers (``device.py``), HOST buffers as files in shared memory that outlive a dead service
(``host.py``), DISK spill files with checksums (``disk.py``), and the store's records and
errors (``records.py``).

Imports nothing else of the runtime. Must not know: jobs, calls, Ray, scheduling.
"""
