"""Where an admission cycle's time goes, on plan_latency's saturated 2,048-GPU cluster.

Runs plan_latency's driver and, for each plan that admitted a job, splits the thread's CPU
time into placement (``allocation.admit_pending`` less its ``ledger.assume`` calls), assuming
the Place decisions (``assume``), and the rest of the cycle (apply, planning the touched
groups, assuming their decisions). The hooks wrap module attributes, so only the bench pays for them. Prints JSON.
"""

import argparse, json, time  # noqa: E401

import numpy as np
import plan_latency as pl

from plexrl.core import ledger, planner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=256)
    parser.add_argument("--cycles", type=int, default=1000)
    args = parser.parse_args()
    spent = {"admit": 0, "assume": 0, "inside": False}
    admit_pending, assume = planner.admit_pending, ledger.assume

    def timed_admit(*a):
        t0, spent["inside"] = time.thread_time_ns(), True
        try:
            return admit_pending(*a)
        finally:
            spent["admit"] += time.thread_time_ns() - t0
            spent["inside"] = False

    def timed_assume(*a):
        t0 = time.thread_time_ns()
        try:
            return assume(*a)
        finally:
            if spent["inside"]:
                spent["assume"] += time.thread_time_ns() - t0

    planner.admit_pending, ledger.assume = timed_admit, timed_assume
    rows = []

    class Driver(pl.Driver):
        def cycle(self, event, now, phase):
            spent.update(admit=0, assume=0, inside=False)
            before = len(self.samples["admission"])
            super().cycle(event, now, phase)
            if len(self.samples["admission"]) > before:
                total = self.samples["admission"][-1][1]
                rows.append((phase, spent["admit"] - spent["assume"], spent["assume"],
                             total - spent["admit"], total))

    Driver(args.jobs).run(args.cycles)
    out = {}
    for phase, name in (("admission", "admission"), ("loaded", "admission_under_load")):
        ms = np.array([r[1:] for r in rows if r[0] == phase], dtype=float) / 1e6
        out[name] = {part: dict(zip(("p50_ms", "p99_ms"), np.round(
            np.percentile(ms[:, i], [50, 99]), 3).tolist()))
            for i, part in enumerate(("placement", "assume", "rest", "total"))}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
