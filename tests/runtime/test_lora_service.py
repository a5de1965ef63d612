"""LoRA on the runtime (D215): adapters on a frozen base that a worker group holds once.

The engine: a new adapter leaves the base's outputs unchanged, training moves the adapters
only, and the base buffer is never written. The runtime: LoRA jobs on one group hold one BASE
State; when the device cannot hold every job's adapters at once, a switch between them moves
adapters, grads and optimizer states, and the base stays on the device; the base goes with
the last job on it; and a job may not take a base's name.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from plexrl.errors import ConfigError
from plexrl.runtime.models import model_spec
from plexrl.runtime.workers.engine import Engine
from plexrl.runtime.workers.lora import LoraEngine

IDS = np.array([[1, 5, 6, 7, 8]])
BATCH = {"input_ids": IDS, "target_tokens": np.array([[5, 6, 7, 8, 9]]),
         "loss_mask": np.ones((1, 5), np.float32)}
LORA = model_spec("policy", "tiny-qwen2", lora_rank=4)


def test_an_adapter_starts_as_its_base_and_training_moves_only_adapters():
    engine = LoraEngine(LORA, seed=3)
    adapters, base = engine.initial_weights(), engine.initial_base()
    assert engine.numel == LORA.total_params and engine.base_numel == LORA.base_params
    whole = Engine(model_spec("policy", "tiny-qwen2"), seed=0)
    with engine.on_base(base):
        assert np.array_equal(engine.logprobs(adapters, IDS),
                              whole.logprobs(whole.initial_weights(), IDS))
    before, start = base.clone(), adapters.clone()
    grads, optimizer = torch.zeros(engine.numel), torch.zeros(engine.optimizer_numel)
    losses = []
    for _ in range(3):
        with engine.on_base(base):
            losses.append(engine.forward_backward(adapters, grads, BATCH, "cross_entropy")["loss"])
        engine.optim_step(adapters, grads, optimizer, lr=1e-2)
    assert losses[-1] < losses[0]
    assert torch.equal(base, before) and not torch.equal(adapters, start)
    with pytest.raises(RuntimeError, match="no base"):
        engine.logprobs(adapters, IDS)


def _tiers(runtime) -> dict[str, str]:
    return {k: v[0] for k, v in runtime.inspect("status")["states"].items()}


def test_lora_jobs_share_one_base_and_switch_by_their_adapters(connect):
    engine = LoraEngine(LORA)
    base_bytes, own_bytes = 4 * engine.base_numel, 4 * (4 * engine.numel + 1)
    # the base and one job's adapters, grads and optimizer fit; two jobs' do not
    runtime = connect(device_bytes=base_bytes + own_bytes * 3 // 2 + (1 << 16))
    jobs = [runtime.register_job(f"lora-{i}", {"policy": LORA}, seed=i) for i in range(3)]
    for step in range(2):
        for job in jobs:
            job.forward_backward(BATCH, loss="cross_entropy", step=step).result()
            job.optim_step(lr=1e-2, step=step).result()
    bases = [k for k in _tiers(runtime) if k.endswith("/base")]
    assert bases == ["base:tiny-qwen2@wg0/policy/trainer/base"]
    moves = runtime.inspect("transitions")
    base_moves = [m for m in moves if m["key"] == bases[0]]
    assert [(m["src"], m["dst"]) for m in base_moves] == [("host", "device")]   # in once
    evicted = {m["job"] for m in moves if m["dst"] == "host"}
    assert evicted >= {"lora-0", "lora-1"}                  # switches moved adapters out
    assert {m["num_bytes"] for m in moves if m["job"].startswith("lora-")} <= \
        {4 * engine.numel, 4 * engine.optimizer_numel}       # adapter-sized, never the base's
    for job in jobs[:2]:
        job.end()
    assert bases[0] in _tiers(runtime)                      # lora-2 still uses it
    jobs[2].end()
    assert _tiers(runtime) == {}
    assert runtime.inspect("bytes")["wg0"]["num_states"] == 0   # the service let it go too


def test_a_job_may_not_take_a_bases_name(connect):
    runtime = connect()
    with pytest.raises(ConfigError, match="base:"):
        runtime.register_job("base:mine", {"policy": LORA})
    runtime.register_job("after", {"policy": LORA}).end()   # nothing else refused
