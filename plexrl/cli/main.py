"""The ``plexrl`` command. Imports are lazy so ``plexrl --help`` is instant.

Owns: argument parsing, the process environment PlexRL needs (Ray and Hugging Face offline
defaults, set before any of them is imported), and turning a ``PlexError`` into one line on
stderr with exit code 2, no traceback and nothing written. Must not know: how a command
does its work (each lives in its own module).
"""

from __future__ import annotations

import argparse
import os
import sys

ENVIRONMENT = {"RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1",
               "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="plexrl", description="Time-slice LLM services across RLVR jobs.")
    sub = parser.add_subparsers(dest="command", required=True)
    sim = sub.add_parser("sim", help="simulate a scenario: per-job GPU-hours per step by mode")
    sim.add_argument("scenario", help="a shipped scenario name (e.g. paper-e2e) or a TOML/JSON file")
    sim.add_argument("--format", choices=("table", "json"), default="table")
    sim.add_argument("--out", help="directory for plots (PNG), a timeline (Perfetto JSON) and the report")
    sim.add_argument("--seed", type=int, help="seed (default: the scenario's)")
    sim.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override a scenario field, e.g. models.qwen7b.mfu=0.3 (repeatable)")
    sim.add_argument("--sweep", nargs="?", const="axes", choices=("axes", "load"),
                     help="sweep the scenario's [sweep.axes] over its seeds instead; "
                          "'--sweep load': a trace scenario at each rho of [trace] load_sweep")
    sim.add_argument("--window", metavar="START:END",
                     help="trace scenarios: write a timeline of seconds START to END of the replay "
                          "(at most 100k events per strategy) into --out")
    from plexrl.cli.demo import add_parser as add_demo
    add_demo(sub)
    from plexrl.cli.trace import add_parser as add_trace
    add_trace(sub)
    from plexrl.cli.service import add_parsers as add_service
    add_service(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    for key, value in ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    args = _parser().parse_args(argv)
    from plexrl.errors import PlexError
    try:
        if args.command == "sim":
            from plexrl.cli.sim import run_sim
            return run_sim(args)
        if args.command == "demo":
            from plexrl.cli.demo import run as run_demo
            return run_demo(args)
        if args.command == "trace":
            from plexrl.cli.trace import run as run_trace
            return run_trace(args)
        from plexrl.cli.service import COMMANDS, run as run_service
        if args.command in COMMANDS:
            return run_service(args)
    except PlexError as err:
        print(f"plexrl: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
