"""The official ``tinker`` SDK (pinned: 0.38.0) training and sampling on PlexRL, unchanged.

Each test starts a runtime (one worker group of one device) whose controller serves the
Tinker API, and drives it with the SDK's own clients: every call its training and sampling
clients make, a supervised loop that resumes bitwise from a saved state, bad requests that
raise the SDK's own errors and change nothing, and ``examples/tinker_rl.py`` from another
process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
from tinker import types

from plexrl.runtime.tinker.server import SDK_VERSION

ROOT = Path(__file__).resolve().parents[2]
os.environ.setdefault("TINKER_TELEMETRY", "0")


@pytest.fixture
def url(connect):
    return connect().inspect("endpoints")["tinker"]


def _sft(tokens: list[int], start: int) -> types.Datum:
    """Next-token prediction on ``tokens``, counting the targets from ``start`` on."""
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:],
                                       "weights": [float(i >= start) for i in
                                                   range(1, len(tokens))]})


DATA = [_sft([1, 5, 6, 7, 8, 9, 10], 3), _sft([1, 11, 12, 13, 2], 2), _sft([1, 20, 21], 1)]
ADAM = types.AdamParams(learning_rate=1e-2)


def _logprobs(out) -> list[np.ndarray]:
    return [np.asarray(o["logprobs"].tolist(), np.float32) for o in out.loss_fn_outputs]


def test_sdk_version_is_pinned():
    assert tinker.__version__ == SDK_VERSION


def test_supervised_loss_falls_and_saved_state_resumes_bitwise(url):
    service = tinker.ServiceClient(base_url=url, api_key="tml-a")
    first = service.create_lora_training_client(base_model="tiny-qwen2", rank=4).result()
    losses = []
    for _ in range(4):
        losses.append(first.forward_backward(DATA, "cross_entropy").result().metrics["loss:sum"])
        first.optim_step(ADAM).result()
    assert losses[-1] < 0.8 * losses[0]
    path = first.save_state("mid").result().path
    assert path.startswith("tinker://") and path.endswith("/weights/mid")
    for _ in range(2):
        first.forward_backward(DATA, "cross_entropy").result()
        first.optim_step(ADAM).result()
    resumed = service.create_training_client_from_state_with_optimizer(path).result()
    for _ in range(2):
        resumed.forward_backward(DATA, "cross_entropy").result()
        resumed.optim_step(ADAM).result()
    ahead, again = (_logprobs(c.forward(DATA, "cross_entropy").result()) for c in (first, resumed))
    assert all(np.array_equal(a, b) for a, b in zip(ahead, again))   # bitwise
    fresh = service.create_lora_training_client(base_model="tiny-qwen2", rank=4).result()
    fresh.load_state(path).result()   # weights only: not the optimizer, so not the same run
    assert np.array_equal(_logprobs(fresh.forward(DATA, "cross_entropy").result())[0],
                          _logprobs(resumed.forward(DATA, "cross_entropy").result())[0]) is False
    service.close("success")


def test_every_call_of_the_training_and_sampling_clients(url):
    service = tinker.ServiceClient(base_url=url, api_key="tml-a")
    training = service.create_lora_training_client(base_model="tiny-llama", rank=8,
                                                   seed=3).result()
    info = training.get_info()
    assert info.model_data.model_name == "tiny-llama" and info.lora_rank == 8
    rl = [types.Datum(model_input=types.ModelInput.from_ints([1, 5, 6, 7]),
                      loss_fn_inputs={"target_tokens": [5, 6, 7, 8],
                                      "logprobs": [-4.0, -4.0, -4.0, -4.0],
                                      "advantages": [0.0, 1.0, -1.0, 0.5]})]
    for loss, config in (("importance_sampling", None), ("ppo", {"clip_low_threshold": 0.9,
                                                                 "clip_high_threshold": 1.1}),
                         ("cispo", None)):
        out = training.forward_backward(rl, loss, loss_fn_config=config).result()
        assert np.isfinite(out.metrics["loss:sum"]) and len(_logprobs(out)[0]) == 4
    forward = training.forward(DATA, "cross_entropy").result()
    assert [len(x) for x in _logprobs(forward)] == [6, 4, 2]
    assert training.optim_step(ADAM).result().metrics["grad_norm:mean"] > 0
    sampler_path = training.save_weights_for_sampler("s1").result().path
    sampler = service.create_sampling_client(model_path=sampler_path)   # GET samplers/{id}
    prompt = types.ModelInput.from_ints([1, 5, 6])
    got = sampler.sample(prompt, num_samples=3, include_prompt_logprobs=True,
                         sampling_params=types.SamplingParams(max_tokens=4, stop=[2])).result()
    assert len(got.sequences) == 3 and got.prompt_logprobs[0] is None
    assert all(1 <= len(s.tokens) <= 4 and len(s.logprobs) == len(s.tokens)
               for s in got.sequences)
    assert all(s.stop_reason == ("stop" if s.tokens[-1] == 2 else "length")
               for s in got.sequences)
    # the prompt's logprobs are the trainer's, at the sampler's weights
    scored = training.forward([types.Datum(
        model_input=types.ModelInput.from_ints([1, 5]),
        loss_fn_inputs={"target_tokens": [5, 6], "weights": [1.0, 1.0]})],
        "cross_entropy").result()
    assert np.allclose(got.prompt_logprobs[1:], _logprobs(scored)[0], atol=1e-5)
    rest = service.create_rest_client()
    weights = rest.get_weights_info_by_tinker_path(sampler_path).result()
    assert weights.base_model == "tiny-llama" and weights.lora_rank == 8
    ephemeral = training.save_weights_and_get_sampling_client().result()
    assert ephemeral.sample(prompt, num_samples=1, sampling_params=types.SamplingParams(
        max_tokens=2)).result().sequences
    cancel = httpx.post(f"{url}/api/v1/cancel_future", json={"request_id": "none"},
                        headers={"X-API-Key": "tml-a"})
    assert cancel.status_code == 200
    service.close("success")


def test_bad_requests_raise_the_sdks_own_errors_and_change_nothing(url):
    service = tinker.ServiceClient(base_url=url, api_key="tml-a")
    with pytest.raises(tinker.BadRequestError, match="base_model 'gpt-5' is not served.*fix"):
        service.create_lora_training_client(base_model="gpt-5", rank=8).result()
    with pytest.raises(tinker.BadRequestError, match="LoRA rank 0 does not fit.*fix: a rank"):
        service.create_lora_training_client(base_model="tiny-qwen2", rank=0).result()
    training = service.create_lora_training_client(base_model="tiny-qwen2", rank=4).result()
    before = _logprobs(training.forward(DATA, "cross_entropy").result())
    bad = types.Datum(model_input=types.ModelInput.from_ints([1, 5, 6]),
                      loss_fn_inputs={"target_tokens": [5, 6, 7], "weights": [1.0, 1.0]})
    with pytest.raises(tinker.BadRequestError, match=r"datum 0: .*'weights'.* 2 values for 3"):
        training.forward_backward([bad], "cross_entropy").result()
    other = tinker.ServiceClient(base_url=url, api_key="tml-b")
    path = training.save_state("mine").result().path
    with pytest.raises(tinker.NotFoundError, match="no checkpoint .* of this API key"):
        other.create_training_client_from_state(path).result()
    stranger = httpx.post(f"{url}/api/v1/get_info", json={"model_id": training.model_id,
                                                          "type": "get_info"},
                          headers={"X-API-Key": "tml-b"})
    assert stranger.status_code == 404 and "fix:" in stranger.json()["detail"]
    assert all(np.array_equal(a, b) for a, b in
               zip(before, _logprobs(training.forward(DATA, "cross_entropy").result())))
    service.close("success")
    other.close("success")


def test_the_rl_example_learns_from_another_process(url):
    env = {**os.environ, "TINKER_BASE_URL": url, "TINKER_API_KEY": "tml-example",
           "TINKER_TELEMETRY": "0"}
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "tinker_rl.py")], env=env,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    rewards = [float(line.split()[-1]) for line in out.splitlines() if line.startswith("step")]
    assert len(rewards) == 20
    assert np.mean(rewards[-5:]) > np.mean(rewards[:5]) + 0.1, rewards
