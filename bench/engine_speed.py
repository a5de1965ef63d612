"""Speed of the flat-buffer engine against plain Hugging Face / torch on the same module.

Measures, with ``torch.set_num_threads(--threads)`` (default 1):

- GENERATE: new tokens per second of ``Engine.generate`` (batch 16, 32 new tokens, no stop)
  against ``module.generate`` (sampling, KV cache) on the same weights and prompts;
- a training step: seconds per ``forward_backward`` (GRPO loss) + ``optim_step`` against a
  plain loop (``functional`` logprobs, the same loss, ``loss.backward()``,
  ``torch.optim.AdamW``) on the same module.

Each figure is the median of ``--repeats`` runs after one warm-up, timed in CPU seconds of
the calling thread (``time.thread_time``: with one torch thread, all of the work, and less
disturbed by other processes on a shared machine), ours and the baseline alternately.
Prints JSON.
"""

import argparse, json, os, statistics, time  # noqa: E401

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from plexrl.losses import get_loss  # noqa: E402
from plexrl.runtime.workers.engine import Engine  # noqa: E402
from plexrl.runtime.models import build_module, model_spec  # noqa: E402


def _paired_s(ours, baseline, repeats: int) -> tuple[float, float]:
    """Median CPU seconds of the calling thread for each, the two timed alternately."""
    ours(), baseline()
    times: tuple[list, list] = ([], [])
    for _ in range(repeats):
        for fn, out in ((ours, times[0]), (baseline, times[1])):
            t0 = time.thread_time()
            fn()
            out.append(time.thread_time() - t0)
    return statistics.median(times[0]), statistics.median(times[1])


def _batch(rows, prompt_len, new_tokens, vocab, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, vocab, size=(rows, prompt_len + new_tokens))
    loss_mask = np.zeros_like(ids)
    loss_mask[:, prompt_len:] = 1
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "loss_mask": loss_mask,
            "old_logprobs": -np.log(vocab) * np.ones(ids.shape, dtype=np.float32),
            "advantages": rng.standard_normal(rows).astype(np.float32)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default="tiny-qwen2")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    spec = model_spec("bench", args.source)
    engine = Engine(spec, seed=0)
    weights = engine.initial_weights()
    vocab = engine._config.vocab_size
    batch = _batch(args.batch, args.prompt_len, args.new_tokens, vocab)
    prompts = batch["input_ids"][:, :args.prompt_len].tolist()
    new = args.batch * args.new_tokens

    def ours_generate():
        engine.generate(weights, prompts, max_tokens=args.new_tokens,
                        generator=torch.Generator().manual_seed(0))

    module = build_module(spec, 0)
    hf_ids = torch.tensor(prompts)

    def hf_generate():
        with torch.no_grad():
            module.generate(hf_ids, attention_mask=torch.ones_like(hf_ids), do_sample=True,
                            max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                            top_k=0, pad_token_id=0)

    grads, optimizer = torch.zeros(engine.numel), torch.zeros(engine.optimizer_numel)

    def ours_step():
        engine.forward_backward(weights, grads, batch, "grpo")
        engine.optim_step(weights, grads, optimizer, lr=1e-6)

    adamw = torch.optim.AdamW(module.parameters(), lr=1e-6)
    tensors = {k: torch.as_tensor(v) for k, v in batch.items()}
    loss_fn = get_loss("grpo")

    def plain_step():
        ids = tensors["input_ids"]
        logits = module(input_ids=ids, attention_mask=tensors["attention_mask"]).logits
        picked = logits[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        logprobs = torch.cat([torch.zeros_like(picked[:, :1]), picked], dim=1)
        loss_fn(logprobs, tensors).loss.backward()
        adamw.step()
        adamw.zero_grad()

    gen_s, hf_gen_s = _paired_s(ours_generate, hf_generate, args.repeats)
    step_s, plain_s = _paired_s(ours_step, plain_step, args.repeats)
    print(json.dumps({
        "source": args.source, "params": engine.numel, "threads": args.threads,
        "batch": args.batch, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
        "generate_tokens_per_s": round(new / gen_s, 1),
        "hf_generate_tokens_per_s": round(new / hf_gen_s, 1),
        "generate_speed_vs_hf": round(hf_gen_s / gen_s, 3),
        "train_step_s": round(step_s, 5), "plain_train_step_s": round(plain_s, 5),
        "train_step_vs_plain": round(step_s / plain_s, 3),
    }, indent=1))


if __name__ == "__main__":
    main()
