"""An RL loop written only against the official Tinker SDK, run on PlexRL.

The task is verifiable and built here: a prompt ``[BOS, a]``, ``a`` a digit token, asks the
policy to answer with ``a`` three times; each answer token scores 1 if it is ``a``, 0.25 if it
is another digit, and the reward is their mean.
Each step samples a group of answers per prompt from the current weights, centres the
rewards within each group (GRPO's advantages), trains on them with Tinker's
``importance_sampling`` loss, takes an Adam step and makes a new sampling client. Nothing in
it is PlexRL's: point it at any Tinker server.

    plexrl up        # then: plexrl status  (its "tinker:" line is the URL)
    TINKER_BASE_URL=http://127.0.0.1:PORT TINKER_API_KEY=tml-mine python examples/tinker_rl.py

It prints one line per step, ``step N reward R``, and a fingerprint of the final weights.
"""

from __future__ import annotations

import argparse
import random

import tinker
from tinker import types

BOS, FIRST, LAST = 1, 5, 14          #: the digit tokens
ANSWER = 3                           #: tokens per answer


def reward(prompt: list[int], answer: list[int]) -> float:
    return sum(1.0 if t == prompt[-1] else 0.25 if FIRST <= t <= LAST else 0.0
               for t in answer) / ANSWER


def datum(prompt: list[int], answer: list[int], logprobs: list[float],
          advantage: float) -> types.Datum:
    """Prompt + answer as Tinker's Datum: position t predicts token t + 1; only the answer's
    tokens carry the advantage (and the sampler's logprobs)."""
    tokens = prompt + answer
    n = len(prompt) - 1
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:],
                        "logprobs": [0.0] * n + list(logprobs),
                        "advantages": [0.0] * n + [advantage] * len(answer)})


PROBE = datum([BOS, FIRST], [FIRST] * ANSWER, [0.0] * ANSWER, 1.0)   #: scores the weights


def train(service: tinker.ServiceClient, *, base_model: str = "tiny-qwen2", steps: int = 20,
          prompts: int = 8, group: int = 8, lr: float = 1e-2, seed: int = 0,
          log=None) -> tuple[list[float], float]:
    """Run the loop; returns the mean reward of each step and a fingerprint of the final
    weights (the probe's importance-sampling loss, a float that any change of weight moves)."""
    rng = random.Random(seed)
    training = service.create_lora_training_client(base_model=base_model, rank=8,
                                                   seed=seed).result()
    sampler = training.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=ANSWER, temperature=1.0)
    history = []
    for step in range(steps):
        asked = [[BOS, rng.randint(FIRST, LAST)] for _ in range(prompts)]
        futures = [sampler.sample(types.ModelInput.from_ints(p), num_samples=group,
                                  sampling_params=params) for p in asked]
        data, rewards = [], []
        for prompt, future in zip(asked, futures):
            sequences = future.result().sequences
            scores = [reward(prompt, s.tokens) for s in sequences]
            mean = sum(scores) / len(scores)
            rewards += scores
            data += [datum(prompt, s.tokens, s.logprobs, r - mean)
                     for s, r in zip(sequences, scores) if s.tokens]
        training.forward_backward(data, "importance_sampling").result()
        training.optim_step(types.AdamParams(learning_rate=lr)).result()
        sampler = training.save_weights_and_get_sampling_client().result()
        history.append(sum(rewards) / len(rewards))
        if log:
            log(f"step {step} reward {history[-1]:.3f}")
    probe = training.forward([PROBE], "importance_sampling").result()
    return history, probe.metrics["loss:sum"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--base-model", default="tiny-qwen2")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--prompts", type=int, default=8, help="prompts per step")
    parser.add_argument("--group", type=int, default=8, help="answers per prompt")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    service = tinker.ServiceClient()          # TINKER_BASE_URL, TINKER_API_KEY
    _, fingerprint = train(service, base_model=args.base_model, steps=args.steps,
                           prompts=args.prompts, group=args.group, lr=args.lr, seed=args.seed,
                           log=lambda line: print(line, flush=True))
    print(f"final weights fingerprint {fingerprint!r}")
    service.close("success")


if __name__ == "__main__":
    main()
