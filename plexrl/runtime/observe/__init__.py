"""Observation: what an operator reads off a running controller.

Owns: the controller's log of finished calls (``call_log.py``), the definitions the metrics
and the dashboard share, such as utilisation, slowdown against running alone and why a
call waits (``measures.py``), the Prometheus metrics (``metrics.py``), the live dashboard
(``dashboard.py``) and the HTTP server that serves both on the controller's loop
(``endpoints.py``).

Reads the core's Snapshot and the call log it is handed. Must not know: the controller's
internals, Ray, torch; it changes nothing it reads.
"""
