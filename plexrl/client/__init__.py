"""What a job imports: ``connect()``, then a job's verbs, each returning a future.

Owns: ``connect`` / ``Runtime`` / ``JobClient`` (``job.py``), the ``Transport`` protocol and the
registry that finds a runtime by address scheme (``transport.py``), and a mock transport
built from a plain function for tests (``mock.py``). Imports only the vocabulary
(``plexrl.protocol``, ``plexrl.config``, ``plexrl.errors``) and the standard library: never
the runtime, the simulator, ray or torch.
"""

from plexrl.client.job import JobClient, Runtime, connect, connect_submitted
from plexrl.client.transport import Transport, open_transport, register_transport

__all__ = ["JobClient", "Runtime", "Transport", "connect", "connect_submitted", "open_transport",
           "register_transport"]
