"""Benchmark: fcfs, round-robin and hrrs on one shared training pool, across a load sweep.

For each shipped queue scenario (queues-mixed, queues-agentic) and each load point of its
``[sweep.axes.load]`` (every job's think time), runs the first experiment in plexrl mode
under each policy, over the scenario's ``[sweep] seeds`` seeds (calls pooled, worst slowdown
over the seeds; plexrl/sim/experiments/queue_study.py) and prints ONE JSON object: per load point the
offered load, and per policy the mean and p99 call wait on the shared pool (``*_wait_s``:
start - queued; ``*_ready_wait_s``: start - when the call became runnable, the wait the
claim is tested on, docs/design.md, D46), the share of calls that started while
another job's call waited (``contended``), each job's slowdown against the same job alone,
and the worst one; then, per point, whether hrrs meets issue 3's claim against fcfs on the
ready wait (lower mean, lower p99, worst slowdown <= fcfs's + 10%), and the same on the
wait since queued. Deterministic: fixed seeds. ``--set`` overrides apply to every scenario.
"""

import argparse, json, sys, time  # noqa: E401

from plexrl.sim.experiments.queue_study import seeds, study, to_json
from plexrl.sim.scenario import load_scenario

SCENARIOS = ("queues-mixed", "queues-agentic")


def claim(row: dict, wait: str) -> dict:
    f, h = row["policies"]["fcfs"], row["policies"]["hrrs"]
    return {"lower_mean": h[f"mean_{wait}"] < f[f"mean_{wait}"],
            "lower_p99": h[f"p99_{wait}"] < f[f"p99_{wait}"],
            "worst_slowdown_within_10pct": h["worst_slowdown"] <= 1.1 * f["worst_slowdown"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", action="append", help="default: both shipped ones")
    parser.add_argument("--set", action="append", default=[], dest="overrides")
    args = parser.parse_args()
    out = {"scenarios": {}}
    start = time.perf_counter()
    for name in args.scenario or SCENARIOS:
        s = load_scenario(name, tuple(args.overrides))
        rows = to_json(study(s))
        for row in rows:
            row["hrrs_vs_fcfs"] = claim(row, "ready_wait_s")
            row["hrrs_vs_fcfs_wait_since_queued"] = claim(row, "wait_s")
        out["scenarios"][name] = {"experiment": next(iter(s.experiments)),
                                  "num_steps": s.num_steps, "seeds": list(seeds(s)),
                                  "points": rows}
    out["wall_s"] = round(time.perf_counter() - start, 1)
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
