"""The Tinker API on the controller: the official ``tinker`` SDK pointed at PlexRL
(``TINKER_BASE_URL``, ``TINKER_API_KEY``) talks to this room (docs/design.md, D209).

Owns: a small HTTP/1.1 server with keep-alive (``http.py``); the server, its dispatch and
sessions (``server.py``); whose is what (``tenants.py``); the routes on models
(``model_routes.py``) and on sampling (``sampling_routes.py``); a model as a PlexRL job
(``training.py``); the SDK's wire format (``wire.py``), losses (``batches.py``) and futures
(``futures.py``).
Must not know: scheduling, Ray, torch; it reaches the controller only through what it is handed.
"""
