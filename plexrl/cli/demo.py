"""``plexrl demo``: several RLVR jobs at once on one shared worker group (see plexrl.demo).

Owns: turning the parsed arguments into one ``plexrl.demo.main.run_demo`` call. Must not
know: how the jobs run or what is measured.
"""

from __future__ import annotations

from pathlib import Path


def add_parser(sub) -> None:
    import argparse
    demo = sub.add_parser("demo", help="train 3 RLVR jobs at once on one shared worker group")
    demo.add_argument("--quick", action="store_true", help="a shorter run (under 90 s)")
    demo.add_argument("--out", default="plexrl-demo", help="directory for the record, curves "
                                                           "(PNG) and timeline (Perfetto JSON)")
    demo.add_argument("--isolated", action="store_true",
                      help="run the same jobs one after another, each alone")
    demo.add_argument("--record", action="store_true",
                      help="with --isolated: write the baseline the shared run compares to")
    demo.add_argument("--baseline", choices=("auto", "refresh", "skip"), default="auto",
                      help="auto (default): when --out holds no isolated record, record it "
                           "first (the same jobs one after another), then run shared; "
                           "refresh: record it first in any case; skip: the shared run only")
    demo.add_argument("--devices", type=int, default=1,
                      help="devices of the one worker group: each job's model is sharded over "
                           "them, one rank per device (default 1)")
    demo.add_argument("--scale", type=float, default=1.0, help=argparse.SUPPRESS)


def run(args) -> int:
    from plexrl.demo.main import run_demo
    return run_demo(quick=args.quick, out=Path(args.out), isolated=args.isolated,
                    record=args.record, baseline=args.baseline, scale=args.scale,
                    devices=args.devices)
