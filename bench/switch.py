"""The switch time a job still waits for with prefetch on, against prefetch off.

Three jobs, each a frozen small-qwen2 (weights only, 40 MB), send LOGPROBS calls in a
closed loop from their own threads to one worker group whose budget holds two of them: every
call needs a switch. With prefetch, the next job's weights are copied in while the current
call runs; without, after it ends. The exposed switch of a call is the controller's gap from
the end of the previous call on the group (another job's) to its dispatch. Prints one JSON
object: the onload time of a State, the exposed switch with prefetch on and off, and the share
of the copy that prefetch hid.
"""

import argparse, json, statistics, threading  # noqa: E401

import numpy as np

from plexrl.client import Runtime
from plexrl.protocol import Role
from plexrl.runtime.config import RuntimeConfig
from plexrl.runtime.models import model_spec
from plexrl.runtime.transport import RayTransport, init_local

SPEC = model_spec("frozen", source="small-qwen2", trainable=False)
BATCH = {"input_ids": np.arange(1, 129, dtype=np.int64).reshape(2, 64)}


def run(prefetch: bool, calls: int) -> dict:
    weights = 4 * int(SPEC.total_params)
    config = RuntimeConfig(device_bytes=2 * weights + (8 << 20), prefetch=prefetch)  # not 3
    runtime = Runtime(RayTransport(config=config))
    jobs = [runtime.register_job(f"j{i}", {"reference": SPEC}, seed=i) for i in range(3)]

    def drive(job):
        for _ in range(calls):
            job.logprobs(BATCH, role=Role.REFERENCE).result()
    threads = [threading.Thread(target=drive, args=(job,)) for job in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log = sorted(runtime.inspect("calls"), key=lambda c: c["start_s"])
    moves = [m for m in runtime.inspect("transitions") if m["dst"] == "device"]
    runtime.close()
    gaps = [b["start_s"] - a["end_s"] for a, b in zip(log, log[1:]) if a["job"] != b["job"]]
    return {"prefetch": prefetch, "calls": len(log), "switches": len(gaps),
            "onloads": len(moves), "onload_ms": 1e3 * statistics.median(m["seconds"] for m in moves),
            "exposed_switch_ms_p50": 1e3 * statistics.median(gaps),
            "exposed_switch_ms_mean": 1e3 * statistics.fmean(gaps),
            "call_ms_p50": 1e3 * statistics.median(c["duration_s"] for c in log)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=30, help="calls per job")
    args = parser.parse_args()
    init_local(num_devices=1)
    off, on = run(False, args.calls), run(True, args.calls)
    print(json.dumps({"bench": "switch", "state_bytes": 4 * int(SPEC.total_params),
                      "prefetch_off": off, "prefetch_on": on,
                      "hidden_frac": round(1 - on["exposed_switch_ms_mean"]
                                           / off["exposed_switch_ms_mean"], 3)}))


if __name__ == "__main__":
    main()
