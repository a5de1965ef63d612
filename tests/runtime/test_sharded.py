"""Worker groups of several devices: one model replica sharded over the group's ranks.

- a model whose States do not fit one device is placed on, and trains on, a 2-rank group,
  each rank holding half of its bytes, with the tokens and (within fp32 reduce order) the
  losses of one device large enough to hold it; one that fits no group is refused;
- a rollout copy on another group than its trainer copy takes the trainer's weights at each
  SYNC_WEIGHTS (gathered from the trainer's ranks): bitwise the run of one group;
- a rank killed mid-call fails its group's jobs with ``ServiceLost`` naming the rank, its
  HOST copies outlive it, and a job on another group finishes its steps.

Few and small: two ranks on two cores are slow.
"""

from __future__ import annotations

import time
from urllib.parse import unquote

import numpy as np
import pytest
import ray

import grpo_like
from safetensors.torch import load_file

from plexrl.errors import CallError, PlacementError, ServiceLost
from plexrl.runtime.models import model_spec

SPEC = model_spec("policy", source="tiny-qwen2")
P = int(SPEC.total_params)
JOB_BYTES = 4 * P + 4 * P + (8 * P + 4) + 4 * P   # trainer weights, grads, optimizer; rollout
ONE_DEVICE = JOB_BYTES // 2 + 4 * P               # half a job's States, a call's workspace


def _sft_steps(job, steps: int) -> list[float]:
    """``steps`` SFT steps on a fixed batch (no sampling): the loss of each."""
    ids = np.array([[1, 5, 9, 13, 17, 21], [1, 7, 3, 11, 0, 0], [2, 4, 6, 8, 10, 12]])
    batch = {"input_ids": ids, "attention_mask": (ids > 0).astype(np.int64),
             "loss_mask": (ids > 0).astype(np.float32)}
    losses = []
    for k in range(steps):
        losses.append(job.forward_backward(batch, loss="cross_entropy", step=k)
                      .result()["loss"])
        job.optim_step(lr=1e-3, step=k).result()
    return losses


def test_a_model_too_big_for_one_device_trains_on_two_ranks_as_on_one_big_device(connect):
    assert JOB_BYTES > ONE_DEVICE
    # a 1-device group cannot hold it; the 2-device group can, and gets it
    sharded = connect(groups=(("small", 1), ("pair", 2)), device_bytes=ONE_DEVICE)
    job = sharded.register_job("a", {"policy": SPEC}, seed=3)
    assert set(sharded.inspect("status")["jobs"]["a"].values()) == {"pair"}
    steps = [grpo_like.step(job, k) for k in range(2)]
    losses = _sft_steps(job, 3)
    held = sharded.inspect("bytes")["pair"]
    ranks = [r["device_bytes"] for r in held["ranks"]]
    assert len(ranks) == 2 and sum(ranks) == held["device_bytes"]
    assert all(abs(r - held["device_bytes"] / 2) <= 64 for r in ranks), ranks  # about half each
    big_model = model_spec("policy", source="small-qwen2")   # fits no group here: refused
    with pytest.raises(PlacementError, match=r"\d{6,}"):
        sharded.register_job("huge", {"policy": big_model}, seed=1)
    assert set(sharded.inspect("status")["jobs"]) == {"a"}
    with pytest.raises(CallError, match="bytes of device workspace"):   # never fits: refused
        job.generate([[1, 2, 3]] * 64, step=2, max_tokens=200).result()

    big = connect(device_bytes=2 * ONE_DEVICE)
    alone = big.register_job("a", {"policy": SPEC}, seed=3)
    reference = [grpo_like.step(alone, k) for k in range(2)]
    for k, (mine, one) in enumerate(zip(steps, reference)):
        assert np.array_equal(mine["tokens"], one["tokens"]), f"step {k}: tokens depend on n"
        np.testing.assert_allclose(mine["old_logprobs"], one["old_logprobs"], rtol=0, atol=1e-4)
    np.testing.assert_allclose(losses, _sft_steps(alone, 3), rtol=1e-5)


def test_a_rank_killed_mid_call_fails_its_group_with_service_lost_naming_it(connect):
    runtime = connect(groups=(("pair", 2), ("solo", 1)), device_bytes=100 * P)
    jobs = {name: runtime.register_job(name, {"policy": SPEC}, seed=5) for name in ("x", "y")}
    status = runtime.inspect("status")["jobs"]
    group_of = {job: next(iter(set(groups.values()))) for job, groups in status.items()}
    assert set(group_of.values()) == {"pair", "solo"}            # spread: one job per group
    victim = next(job for job, wg in group_of.items() if wg == "pair")
    survivor = next(job for job in jobs if job != victim)
    jobs[victim].generate([[1, 2, 3]], step=0, max_tokens=2).result()   # its rollout copy is in
    rank1_host = runtime.transport.host_dir("pair") / "rank1"
    rank1 = ray.get_actor(f"plexrl-{runtime.transport.session}-service-pair-rank1")
    running = jobs[victim].generate([[1, 2, 3]] * 16, step=0, max_tokens=200)
    while runtime.inspect("status")["running"] == 0 and not running.done():
        time.sleep(0.005)   # until the core dispatched it: the kill lands while it runs
    assert not running.done()
    ray.kill(rank1)
    with pytest.raises(ServiceLost) as lost:
        running.result()
    assert (lost.value.wg, lost.value.rank) == ("pair", 1), lost.value
    assert "rank 1" in str(lost.value)
    with pytest.raises(ServiceLost):                                   # and every later call
        jobs[victim].logprobs({"input_ids": np.array([[1, 2]])}, step=0).result()
    for k in range(2):                                                  # the other group goes on
        assert grpo_like.step(jobs[survivor], k)["tokens"].shape == (4, grpo_like.MAX_TOKENS)
    left = {unquote(p.name) for p in (rank1_host / "named").iterdir()}
    assert any(name.startswith(f"{victim}/") for name in left), left   # HOST copies outlived it


def _split(groups) -> dict:
    return {"groups": groups, "device_bytes": JOB_BYTES + 8 * P}


def test_a_rollout_copy_on_another_group_runs_bitwise_as_on_the_trainers_group(connect,
                                                                             tmp_path):
    runs = {}
    for name, groups in {"one": (("wg0", 1),),
                         "split": (("train", 1, "train"), ("roll", 1, "rollout"))}.items():
        runtime = connect(**_split(groups))
        job = runtime.register_job("a", {"policy": SPEC}, seed=7)
        steps = [grpo_like.step(job, k) for k in range(2)]
        job.save(str(tmp_path / f"{name}.safetensors")).result()
        runs[name] = (steps, runtime.inspect("status")["jobs"]["a"])
    assert set(runs["split"][1].values()) == {"train", "roll"}, runs["split"][1]
    for k, (one, split) in enumerate(zip(runs["one"][0], runs["split"][0])):
        for key in ("tokens", "gen_logprobs", "old_logprobs"):
            assert np.array_equal(one[key], split[key]), (k, key)
    a, b = (load_file(str(tmp_path / f"{n}.safetensors")) for n in ("one", "split"))
    assert all(np.array_equal(a[k].numpy(), b[k].numpy()) for k in ("weights", "optimizer"))


def test_a_sharded_trainer_syncs_its_gathered_weights_to_a_rollout_group(connect):
    runtime = connect(**_split((("train", 2, "train"), ("roll", 1, "rollout"))))
    job = runtime.register_job("a", {"policy": SPEC}, seed=7)
    for k in range(2):   # on-policy: each step samples the weights the trainer just made
        out = grpo_like.step(job, k, lr=5e-2)
        prompts = [p for p in grpo_like.PROMPTS for _ in range(grpo_like.GROUP)]
        for i, prompt in enumerate(prompts):   # token t's logprob sits at column t
            n = int((out["gen_logprobs"][i] != 0).sum())
            np.testing.assert_allclose(out["gen_logprobs"][i, :n],
                                       out["old_logprobs"][i, len(prompt):len(prompt) + n],
                                       atol=1e-4, err_msg=f"step {k} row {i}")
