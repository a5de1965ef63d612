"""Benchmark: a plain ``heapq`` event loop against SimPy for the simulator's virtual clock.

The simulator drives the core with a virtual clock; this measures which loop is faster on
the same synthetic workload, and checks that both give identical completion times.

Workload: NUM_JOBS jobs, each bound to one of NUM_WORKER_GROUPS worker groups (job j on
group j % NUM_WORKER_GROUPS). A job alternates a think (tool stall) and a call; a call waits
in its worker group's FIFO, then runs for its service time. Think and service times are
lognormal, drawn up front from one seeded generator, so both loops consume the same numbers.
Events counted: one arrival and one finish per call.

Prints one JSON object: events, best-of-REPEATS seconds and events/s for each loop, and
``ratio_simpy_over_heap`` (> 1 means SimPy is slower).
"""

from __future__ import annotations

import collections
import heapq
import json
import random
import time

import simpy

NUM_WORKER_GROUPS = 200
NUM_JOBS = 1_000
NUM_CALLS_PER_JOB = 100
SEED = 0
REPEATS = 3
SERVICE_MU, SERVICE_SIGMA = 0.0, 1.0  # log-seconds: median call 1 s, long tail
THINK_MU, THINK_SIGMA = 1.0, 1.5  # log-seconds: median tool stall e = 2.7 s

FINISH, ARRIVAL = 0, 1  # priorities: at equal time a finish frees the group first


def make_workload(seed: int = SEED) -> tuple[list[list[float]], list[list[float]]]:
    """Per job, its think_s and service_s for each call, drawn from one seeded generator."""
    rng = random.Random(seed)
    think_s = [[rng.lognormvariate(THINK_MU, THINK_SIGMA) for _ in range(NUM_CALLS_PER_JOB)]
               for _ in range(NUM_JOBS)]
    service_s = [[rng.lognormvariate(SERVICE_MU, SERVICE_SIGMA)
                  for _ in range(NUM_CALLS_PER_JOB)] for _ in range(NUM_JOBS)]
    return think_s, service_s


def run_heap(think_s, service_s) -> tuple[list[list[float]], int]:
    """The heap loop; returns each job's call finish times and the number of events."""
    heap: list[tuple[float, int, int, int]] = []  # (time_s, priority, seq, job)
    seq = 0
    waiting = [collections.deque() for _ in range(NUM_WORKER_GROUPS)]
    busy = [False] * NUM_WORKER_GROUPS
    finished_s: list[list[float]] = [[] for _ in range(NUM_JOBS)]
    for job in range(NUM_JOBS):
        heapq.heappush(heap, (think_s[job][0], ARRIVAL, seq, job))
        seq += 1
    num_events = 0
    while heap:
        now_s, kind, _, job = heapq.heappop(heap)
        num_events += 1
        group = job % NUM_WORKER_GROUPS
        if kind == ARRIVAL:
            if busy[group]:
                waiting[group].append(job)
                continue
            busy[group] = True
            heapq.heappush(heap, (now_s + service_s[job][len(finished_s[job])], FINISH, seq, job))
            seq += 1
            continue
        finished_s[job].append(now_s)
        if waiting[group]:
            nxt = waiting[group].popleft()
            heapq.heappush(heap, (now_s + service_s[nxt][len(finished_s[nxt])], FINISH, seq, nxt))
            seq += 1
        else:
            busy[group] = False
        if len(finished_s[job]) < NUM_CALLS_PER_JOB:
            heapq.heappush(heap, (now_s + think_s[job][len(finished_s[job])], ARRIVAL, seq, job))
            seq += 1
    return finished_s, num_events


def run_simpy(think_s, service_s) -> tuple[list[list[float]], int]:
    """The SimPy loop (one process per job, one capacity-1 Resource per group)."""
    env = simpy.Environment()
    groups = [simpy.Resource(env, capacity=1) for _ in range(NUM_WORKER_GROUPS)]
    finished_s: list[list[float]] = [[] for _ in range(NUM_JOBS)]

    def job_process(job: int):
        group = groups[job % NUM_WORKER_GROUPS]
        for call in range(NUM_CALLS_PER_JOB):
            yield env.timeout(think_s[job][call])
            with group.request() as request:
                yield request
                yield env.timeout(service_s[job][call])
            finished_s[job].append(env.now)

    for job in range(NUM_JOBS):
        env.process(job_process(job))
    env.run()
    return finished_s, 2 * NUM_JOBS * NUM_CALLS_PER_JOB


def best_of(runner, think_s, service_s) -> tuple[float, list[list[float]], int]:
    """Best wall seconds of REPEATS runs, with the last run's result."""
    best_s = float("inf")
    for _ in range(REPEATS):
        start_s = time.perf_counter()
        finished_s, num_events = runner(think_s, service_s)
        best_s = min(best_s, time.perf_counter() - start_s)
    return best_s, finished_s, num_events


def main() -> None:
    think_s, service_s = make_workload()
    heap_s, heap_finished, num_events = best_of(run_heap, think_s, service_s)
    simpy_s, simpy_finished, simpy_events = best_of(run_simpy, think_s, service_s)
    assert num_events == simpy_events == 2 * NUM_JOBS * NUM_CALLS_PER_JOB, num_events
    assert heap_finished == simpy_finished, "the two loops disagree on completion times"
    print(json.dumps({
        "num_worker_groups": NUM_WORKER_GROUPS, "num_jobs": NUM_JOBS,
        "num_calls_per_job": NUM_CALLS_PER_JOB, "seed": SEED, "repeats": REPEATS,
        "events": num_events,
        "makespan_s": max(times[-1] for times in heap_finished),
        "heap_s": round(heap_s, 4), "simpy_s": round(simpy_s, 4),
        "heap_events_per_s": round(num_events / heap_s),
        "simpy_events_per_s": round(num_events / simpy_s),
        "ratio_simpy_over_heap": round(simpy_s / heap_s, 3),
    }))


if __name__ == "__main__":
    main()
