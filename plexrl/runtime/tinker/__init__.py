"""The Tinker API on the controller: the official ``tinker`` SDK pointed at PlexRL
(``TINKER_BASE_URL``, ``TINKER_API_KEY``) talks to this room (docs/design.md, D209).

Owns: a small HTTP/1.1 server with keep-alive on the controller's asyncio loop
(``http.py``), and the Tinker routes, sessions and tenants' keys (``server.py``). Must not
know: scheduling, Ray, torch; it reaches the controller only through what it is handed.
"""
