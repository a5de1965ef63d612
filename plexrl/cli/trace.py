"""``plexrl trace``: a Perfetto/Chrome trace of a window of a running controller's records.

Owns: the command's arguments, finding the controller (the one ``plexrl up`` started, from
the run directory, unless ``--address``/``--controller`` say otherwise), turning its window
(seconds since the controller started; negative: seconds before now) into the records'
clock, and writing the file (``plexrl.trace_export.export_trace`` lays it out).
Must not know: how records are made.
"""

from __future__ import annotations

from pathlib import Path


def add_parser(sub) -> None:
    trace = sub.add_parser("trace", help="write a Perfetto/Chrome trace of a running controller")
    trace.add_argument("-o", "--out", required=True, help="the trace file (JSON) to write")
    trace.add_argument("--job", help="only this job's calls and transitions")
    trace.add_argument("--since", type=float, metavar="T",
                       help="window start, s since the controller started (negative: before now)")
    trace.add_argument("--until", type=float, metavar="T",
                       help="window end, s since the controller started (negative: before now)")
    trace.add_argument("--address", help="the Ray cluster (default: the one `plexrl up` "
                                         "recorded)")
    trace.add_argument("--controller", help="the controller's name in namespace plexrl "
                                            "(default: the one `plexrl up` started)")


def on_clock(t: float | None, clock: dict) -> float | None:
    """A window end given in seconds since the start (or before now) on the records' clock."""
    if t is None:
        return None
    return clock["now_s"] + t if t < 0 else clock["started_s"] + t


def run(args) -> int:
    from plexrl.runtime.attach import inspect_named
    from plexrl.trace_export import export_trace
    got = inspect_named(("clock", "calls", "transitions"), controller=args.controller,
                        address=args.address)
    clock = got["clock"]
    timeline = export_trace(got["calls"], got["transitions"], job=args.job,
                            since=on_clock(args.since, clock), until=on_clock(args.until, clock),
                            origin_s=clock["started_s"])
    path = timeline.write(Path(args.out))
    print(f"wrote {path}: {len(timeline)} events (open it in ui.perfetto.dev)")
    return 0
