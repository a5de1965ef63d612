"""What a team submits: job files and the child process that runs a job's program.

Owns: the schema and validation of a job file (``jobspec.py``: TOML or YAML, every error
naming the file, field, value and fix) and a submitted program's process group, its log and
its exit status (``supervisor.py``). The controller's side of submissions (queueing, tokens,
starting the program once placed) is ``control/submissions.py``.

May read the runtime's model sources. Must not know: the controller, Ray, scheduling.
"""
