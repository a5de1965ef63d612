"""What the controller lets tests, tools and the CLI read, a mixin of the controller.

Owns: ``inspect(what)`` (the call log, transitions, bytes per tier, executions, resumable
jobs, endpoints, the records' clock, a status summary) and ``service(wg)`` (a service
actor's handle). Reads only; changes nothing. Must not know: scheduling, torch.
"""

from __future__ import annotations

import asyncio
import time

from plexrl.errors import ConfigError
from plexrl.runtime.control import recovery


class Inspection:
    async def inspect(self, what: str):
        await self._up()
        if what == "calls":
            return list(self.call_log)
        if what == "executions":
            counts = await asyncio.gather(*(s.executions.remote()
                                            for s in self.executor.services.values()))
            return dict(zip(self.executor.services, counts))
        if what == "resumable":
            return recovery.resumable(self.journal)
        if what in ("transitions", "failed-transitions"):
            logs = await asyncio.gather(*(s.transitions.remote(what != "transitions")
                                          for s in self.executor.services.values()))
            return sorted((t for log in logs for t in log), key=lambda t: t.get("end_s", 0))
        if what == "bytes":
            stats = await asyncio.gather(*(s.stats.remote()
                                           for s in self.executor.services.values()))
            return dict(zip(self.executor.services, stats))
        if what == "endpoints":   # where to read metrics and the dashboard (plexrl status)
            return {**self.endpoints.urls(), "tinker": self.tinker.url}
        if what == "clock":       # the records' clock: its zero (start) and now, monotonic s
            return {"started_s": self.endpoints.started_s, "now_s": time.monotonic()}
        if what == "status":
            return {"jobs": {j: {str(k): v for k, v in r.groups.items()}
                             for j, r in self.jobs.items()},
                    "states": {str(k): (v.tier, v.num_bytes, v.version)
                               for k, v in self.snap.states.items()},
                    "queued": len(self.snap.queued), "running": len(self.snap.running)}
        raise ConfigError("nothing to inspect by this name", value=what,
                          fix="one of calls, transitions, failed-transitions, bytes, status, "
                              "executions, resumable, endpoints, clock")

    async def service(self, wg: str):
        """The handle of a worker group's service actor (tests, tools)."""
        await self._up()
        return [self.executor.services[wg]]
