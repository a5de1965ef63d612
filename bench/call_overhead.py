"""What the runtime adds to a call: a small GENERATE through client, controller and service,
against the same engine called directly in the same run.

The direct baseline runs inside a Ray actor with the service's torch thread count (an actor
runs torch on fewer threads than a shell), on the same weights and generator seed. The two
alternate, call by call (``--calls`` each after ``--warmup``), so drifting load hits both
alike; the added time per call is the difference of the medians. Prints one JSON object.
"""

import argparse, json, os, statistics, time  # noqa: E401

import ray

from plexrl.client import Runtime
from plexrl.runtime.config import RuntimeConfig
from plexrl.runtime.models import model_spec
from plexrl.runtime.transport import RayTransport, init_local

PROMPTS = [[1, 2, 3, 4]]


@ray.remote(num_cpus=0)
class Direct:
    """The engine alone, as the service would run it (same threads, flat weights)."""

    def __init__(self, spec, threads: int):
        import torch

        from plexrl.runtime.workers.engine import Engine
        torch.set_num_threads(threads)
        self.engine = Engine(spec, seed=0)
        self.weights = self.engine.initial_weights()
        self.generator = torch.Generator().manual_seed(0)

    def generate(self, max_tokens: int) -> float:
        start = time.perf_counter()
        self.engine.generate(self.weights, PROMPTS, max_tokens=max_tokens,
                             generator=self.generator)
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=4)
    args = parser.parse_args()
    init_local(num_devices=1)
    config = RuntimeConfig()
    spec = model_spec("bench", source="tiny-qwen2")

    direct = Direct.options(runtime_env={"env_vars": {"OMP_NUM_THREADS": str(config.threads)}}
                            ).remote(spec, config.threads)
    runtime = Runtime(RayTransport(config=config))
    job = runtime.register_job("bench", {"policy": spec})
    inside, through = [], []
    for i in range(args.warmup + args.calls):   # alternate, so drift in load hits both alike
        took = ray.get(direct.generate.remote(args.max_tokens))
        start = time.perf_counter()
        job.generate(PROMPTS, step=0, max_tokens=args.max_tokens, temperature=1.0).result()
        if i >= args.warmup:
            inside.append(took)
            through.append(time.perf_counter() - start)
    runtime.close()
    direct_ms = 1e3 * statistics.median(inside)
    runtime_ms = 1e3 * statistics.median(through)
    print(json.dumps({
        "bench": "call_overhead", "calls": args.calls, "max_tokens": args.max_tokens,
        "engine_direct_ms_p50": round(direct_ms, 3),
        "through_runtime_ms_p50": round(runtime_ms, 3),
        "through_runtime_ms_p90": round(1e3 * sorted(through)[int(0.9 * len(through))], 3),
        "added_ms_per_call": round(runtime_ms - direct_ms, 3),
        "ratio": round(runtime_ms / direct_ms, 3), "target_added_ms": 5.0,
        "cpus": os.cpu_count()}))


if __name__ == "__main__":
    main()
