"""Multi-turn rollouts: the model writes, calls a tool, reads its result, writes on.

Owns: ``Episode`` (one row: the prompt, then model tokens and tool-result tokens, and which
of them the model sampled), ``rollout`` (turns of GENERATE; after each, the calls that end a
row's turn run as tool calls, their rendered results are appended, and the row goes on) and
``episode_batch`` (the rows as the losses read them: ``loss_mask`` on model tokens only).

How it runs: every turn is one GENERATE of the rows still going, with stop = (eos, the
tool-call close token). A row ends on eos, on a turn that hits ``max_tokens`` without a
call, or after ``max_turns`` turns. Between two GENERATEs the job issues no call while its
tools run, so its worker group is free for other jobs' calls (the runtime needs no notice
of the stall). A tool failure is the result the model reads (``{timeout}``) and a count in
the ToolBox's report; it never ends the job. Tool-result tokens are context, not actions:
they get no loss and no logprob.
Must not know: the runtime, torch, ray, how a tool is sandboxed (``tools`` does that).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from plexrl.rl.tools import ToolBox, ToolResult


@dataclass
class Episode:
    """One row of a rollout. ``ids`` / ``sampled`` / ``logprobs`` run in parallel after the
    prompt: each token, whether the model sampled it (else a tool result), its sampler
    logprob (0 for tool tokens)."""

    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)
    sampled: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    tool_results: list[ToolResult] = field(default_factory=list)
    turns: int = 0
    done: bool = False
    stopped: bool = False         #: ended on eos (not on a length or turn limit)

    def extend(self, ids: Sequence[int], logprobs: Sequence[float] | None) -> None:
        self.ids += list(map(int, ids))
        self.sampled += [logprobs is not None] * len(ids)
        self.logprobs += list(map(float, logprobs)) if logprobs is not None else [0.0] * len(ids)

    @property
    def context(self) -> list[int]:
        return self.prompt_ids + self.ids

    @property
    def num_sampled(self) -> int:
        return sum(self.sampled)


def rollout(job, tokenizer, prompts: Sequence[Sequence[int]], *, version: int,
            max_tokens: int, toolbox: ToolBox | None = None, max_turns: int = 1,
            temperature: float = 1.0, top_p: float = 1.0) -> list[Episode]:
    """Run ``prompts`` to their end; ``max_tokens`` bounds each turn's model tokens.

    Without a toolbox (or with ``max_turns`` 1) this is one GENERATE. ``version`` is the
    weight version every turn samples (``step`` of the verb).
    """
    episodes = [Episode(list(map(int, p))) for p in prompts]
    close = _close_id(tokenizer, toolbox) if toolbox and max_turns > 1 else None
    stop = (tokenizer.eos_id,) + ((close,) if close is not None else ())
    for turn in range(max_turns):
        active = [e for e in episodes if not e.done]
        if not active:
            break
        gen = job.generate([e.context for e in active], step=version, max_tokens=max_tokens,
                           temperature=temperature, top_p=top_p, stop=stop).result()
        calls = []
        for i, e in enumerate(active):
            n = int(gen["lengths"][i])
            tokens = gen["tokens"][i, :n]
            e.extend(tokens, gen["logprobs"][i, :n])
            e.turns += 1
            last = int(tokens[-1]) if n else None
            if last == tokenizer.eos_id:
                e.done = e.stopped = True
            elif last != close or close is None or turn == max_turns - 1:
                e.done = True
            else:
                calls.append(e)
        _call_tools(calls, tokenizer, toolbox)
    return episodes


def _close_id(tokenizer, toolbox: ToolBox) -> int:
    ids = tokenizer.encode(toolbox.close, add_bos=False)
    if len(ids) != 1:
        raise ValueError(f"the tool-call close {toolbox.close!r} must be one token, got {ids}")
    return ids[0]


def _call_tools(episodes: list[Episode], tokenizer, toolbox: ToolBox | None) -> None:
    """Run the call ending each episode's last turn (concurrently) and append its result."""
    if not episodes:
        return
    texts = [tokenizer.decode(e.ids[_turn_start(e):]) for e in episodes]
    parsed = [toolbox.parse(t) for t in texts]
    results = toolbox.call_many([p for p in parsed if p is not None])
    by_row = iter(results)
    for e, call in zip(episodes, parsed):
        if call is None:                  # the close with no open before it: plain text
            continue
        result = next(by_row)
        e.tool_results.append(result)
        e.extend(tokenizer.encode(toolbox.render(result), add_bos=False), None)


def _turn_start(episode: Episode) -> int:
    """Index in ``ids`` of the first token of the last turn (after the last tool result)."""
    i = len(episode.ids)
    while i > 0 and episode.sampled[i - 1]:
        i -= 1
    return i


def completion_text(tokenizer, episode: Episode) -> str:
    """What the model and the tools wrote after the prompt, as text."""
    return tokenizer.decode(episode.ids)


def episode_batch(episodes: Sequence[Episode], pad_id: int) -> dict[str, np.ndarray]:
    """Prompt + completion per row, right-padded, as ``grpo.build_batch`` lays it out:
    ``loss_mask`` 1 on the tokens the model sampled, ``old_logprobs`` their sampler
    logprobs at the same columns."""
    widths = [len(e.prompt_ids) + len(e.ids) for e in episodes]
    shape = (len(episodes), max(widths))
    ids = np.full(shape, pad_id, dtype=np.int64)
    attention = np.zeros(shape, dtype=np.int64)
    loss_mask = np.zeros(shape, dtype=np.float32)
    old = np.zeros(shape, dtype=np.float32)
    for i, e in enumerate(episodes):
        p, w = len(e.prompt_ids), widths[i]
        ids[i, :w] = e.context
        attention[i, :w] = 1
        loss_mask[i, p:w] = e.sampled
        old[i, p:w] = e.logprobs
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": loss_mask,
            "old_logprobs": old}
