"""A model whose States do not fit one device trains on a worker group of 2 ranks.

The model (``--source``, default small-qwen2, fp32) needs more device memory than one emulated
device has (``fits_one_device: false``, by the core's own byte model); the runtime places it
on a group of ``--ranks`` devices, each rank holding its shard of every State. ``--steps`` SFT
steps (FORWARD_BACKWARD with cross-entropy on a fixed batch, then OPTIM_STEP) run on it, and
the same steps on one device large enough to hold the whole model, in the same run. Prints one
JSON object: the bytes resident on each rank against the total, both loss curves, and their
largest relative difference (target <= 1e-5: fp32 on both sides; only the order of the
reductions differs). Exit 1 if the target is missed.
"""

import argparse, json  # noqa: E401

import numpy as np

from plexrl.client import Runtime
from plexrl.core.jobs import ModelDecl, state_bytes
from plexrl.protocol import Copy, Role, State
from plexrl.runtime.config import RuntimeConfig, WorkerGroupConfig
from plexrl.runtime.models import model_spec
from plexrl.runtime.transport import RayTransport, init_local

TARGET_REL = 1e-5


def job_bytes(spec, devices: int) -> int:
    """Device bytes of all of a job's States on a group of ``devices`` (the core's count)."""
    decl = ModelDecl(Role.POLICY, spec, (Copy.TRAINER, Copy.ROLLOUT))
    states = [(Copy.TRAINER, s) for s in (State.WEIGHTS, State.GRADS, State.OPTIMIZER)] \
        + [(Copy.ROLLOUT, State.WEIGHTS)]
    return sum(state_bytes(decl, c, s, devices, 0) for c, s in states)


def batch_of(rows: int, length: int, vocab: int) -> dict:
    ids = np.random.default_rng(0).integers(3, vocab, size=(rows, length))
    return {"input_ids": ids, "attention_mask": np.ones_like(ids),
            "loss_mask": np.ones(ids.shape, dtype=np.float32)}


def train(groups, device_bytes: int, spec, steps: int, lr: float, batch: dict) -> dict:
    config = RuntimeConfig(worker_groups=tuple(WorkerGroupConfig(n, d) for n, d in groups),
                           device_bytes=device_bytes)
    runtime = Runtime(RayTransport(config=config))
    try:
        job = runtime.register_job("sft", {"policy": spec}, seed=0)
        losses = []
        for k in range(steps):
            losses.append(job.forward_backward(batch, loss="cross_entropy", step=k)
                          .result()["loss"])
            job.optim_step(lr=lr, step=k).result()
        held = runtime.inspect("bytes")[groups[0][0]]
        return {"losses": losses, "held": held}
    finally:
        runtime.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="small-qwen2")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--length", type=int, default=64)
    args = parser.parse_args()
    spec = model_spec("policy", source=args.source)
    total = job_bytes(spec, 1)
    activations = int(spec.activation_bytes(args.rows * args.length, training=True))
    # one device: each rank's shard and its call's share, with the gathered weights; not more
    device = (job_bytes(spec, args.ranks) + activations) // args.ranks \
        + spec.dtype_bytes * int(spec.total_params) + (1 << 20)
    fits_one = total + activations <= device
    init_local(num_devices=args.ranks + 1)
    batch = batch_of(args.rows, args.length, spec.vocab_size)
    sharded = train((("pair", args.ranks),), device, spec, args.steps, args.lr, batch)
    alone = train((("one", 1),), 2 * total + activations + (64 << 20), spec, args.steps,
                  args.lr, batch)
    a, b = np.array(sharded["losses"]), np.array(alone["losses"])
    rel = float(np.max(np.abs(a - b) / np.abs(b)))
    ranks = [r["device_bytes"] for r in sharded["held"]["ranks"]]
    out = {"source": args.source, "params": int(spec.total_params), "ranks": args.ranks,
           "steps": args.steps, "device_bytes": device, "job_state_bytes": total,
           "fits_one_device": fits_one, "bytes_resident_per_rank": ranks,
           "resident_share_per_rank": [round(r / sum(ranks), 4) for r in ranks],
           "losses_sharded": [round(x, 7) for x in a], "losses_one_device": [round(x, 7) for x in b],
           "max_rel_diff": rel, "target_rel": TARGET_REL, "meets_target": rel <= TARGET_REL}
    print(json.dumps(out))
    return 0 if out["meets_target"] and not fits_one else 1


if __name__ == "__main__":
    raise SystemExit(main())
