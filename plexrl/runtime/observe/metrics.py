"""The controller's Prometheus metrics, in the text format ``prometheus_client`` renders.

Owns: one registry per controller (never the process-global one), the metric names and
labels below, and bringing them up to date from what the controller already records, at
scrape time: counters advance over the call log and the services' transition logs from a
cursor (each record counted once), gauges are set afresh from the Snapshot.

- ``plexrl_calls_total{job,function}``; ``plexrl_call_failures_total{job,function}``
- ``plexrl_call_wait_seconds{job}`` (histogram: queued to started)
- ``plexrl_call_run_seconds{job}`` (histogram: started to ended)
- ``plexrl_switches_total{wg}`` (a group's next call was another job's)
- ``plexrl_moved_bytes_total{wg,src,dst}`` and ``plexrl_transitions_total{wg,src,dst}``
- ``plexrl_tier_bytes{wg,tier}`` (the core's view of the States bound to a group, per tier)
- ``plexrl_queued_calls{wg}``, ``plexrl_busy_seconds_total{wg}``,
  ``plexrl_worker_group_utilisation{wg}`` (share of the last ``window_s``)
- ``plexrl_job_slowdown{job}`` (against running alone, ``observe.Tally.slowdowns``),
  ``plexrl_saving_frac`` (against isolated, ``observe.Tally.saving``)

Must not know: HTTP, Ray, how the records are made.
"""

from __future__ import annotations

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram,
                               disable_created_metrics, generate_latest)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from plexrl.core.snapshot import Snapshot
from plexrl.runtime.observe.call_log import read_since

WAIT_BUCKETS_S = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST
disable_created_metrics()   # no *_created series: this process serves only the controller


class RuntimeMetrics:
    """Metrics of one controller; ``update`` them, then ``render``."""

    def __init__(self, window_s: float = 60.0):
        self.window_s = window_s
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.calls = Counter("plexrl_calls", "calls finished", ["job", "function"], registry=r)
        self.failures = Counter("plexrl_call_failures", "calls that failed",
                                ["job", "function"], registry=r)
        self.wait = Histogram("plexrl_call_wait_seconds", "seconds from queued to started",
                              ["job"], buckets=WAIT_BUCKETS_S, registry=r)
        self.run = Histogram("plexrl_call_run_seconds", "seconds from started to ended",
                             ["job"], buckets=WAIT_BUCKETS_S, registry=r)
        self.switches = Counter("plexrl_switches", "a group's next call was another job's",
                                ["wg"], registry=r)
        self.busy = Counter("plexrl_busy_seconds", "seconds a group ran calls", ["wg"],
                            registry=r)
        self.moved = Counter("plexrl_moved_bytes", "bytes moved between tiers",
                             ["wg", "src", "dst"], registry=r)
        self.moves = Counter("plexrl_transitions", "transitions done", ["wg", "src", "dst"],
                             registry=r)
        self.tier_bytes = Gauge("plexrl_tier_bytes", "bytes of States per tier", ["wg", "tier"],
                                registry=r)
        self.queued = Gauge("plexrl_queued_calls", "calls queued", ["wg"], registry=r)
        self.utilisation = Gauge("plexrl_worker_group_utilisation",
                                 f"share of the last {window_s:g} s a group ran a call", ["wg"],
                                 registry=r)
        self.slowdown = Gauge("plexrl_job_slowdown", "elapsed / (elapsed - blocked)", ["job"],
                              registry=r)
        self.saving = Gauge("plexrl_saving_frac", "1 - shared / isolated device-seconds",
                            registry=r)
        self.num_calls = 0                         #: call log records ever counted
        self.num_moves: dict[str, int] = {}        #: transition log entries counted, per group
        self._last_job: dict[str, str] = {}

    def update(self, call_log: list[dict], snap: Snapshot, new_moves: dict[str, list[dict]],
               readings: dict) -> None:
        """Count the call log past the cursor and the new transitions; set every gauge
        (``readings``: ``observe.readings`` at the same moment)."""
        new, self.num_calls = read_since(call_log, self.num_calls)
        for c in new:
            self._count_call(c)
        for wg, moves in new_moves.items():
            for t in moves:
                self.moved.labels(wg, t["src"], t["dst"]).inc(t["num_bytes"])
                self.moves.labels(wg, t["src"], t["dst"]).inc()
            self.num_moves[wg] = self.num_moves.get(wg, 0) + len(moves)
        self._set_gauges(snap, readings)

    def render(self) -> bytes:
        return generate_latest(self.registry)

    def _count_call(self, c: dict) -> None:
        labels = (c["job"], c["function"])
        self.calls.labels(*labels).inc()
        if c["failed"]:
            self.failures.labels(*labels).inc()
        self.wait.labels(c["job"]).observe(max(0.0, c["start_s"] - c["queued_s"]))
        self.run.labels(c["job"]).observe(max(0.0, c["end_s"] - c["start_s"]))
        self.busy.labels(c["wg"]).inc(max(0.0, c["end_s"] - c["start_s"]))
        self.switches.labels(c["wg"]).inc(0)
        if self._last_job.get(c["wg"], c["job"]) != c["job"]:
            self.switches.labels(c["wg"]).inc()
        self._last_job[c["wg"]] = c["job"]

    def _set_gauges(self, snap: Snapshot, readings: dict) -> None:
        for gauge in (self.tier_bytes, self.queued, self.slowdown):
            gauge.clear()
        for wg, views in snap.states_by_group.items():
            for tier in ("device", "host", "disk"):
                self.tier_bytes.labels(wg, tier).set(
                    sum(v.num_bytes for v in views.values() if v.tier == tier))
        for wg in snap.group_order:
            self.queued.labels(wg).set(len(snap.queued_by_group.get(wg, ())))
        for wg, frac in readings["utilisation"].items():
            self.utilisation.labels(wg).set(frac)
        for job, s in readings["slowdowns"].items():
            if job in snap.jobs:
                self.slowdown.labels(job).set(s["slowdown"])
        self.saving.set(readings["saving"]["saving_frac"])
