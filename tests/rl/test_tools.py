"""Tool calls in limited child processes, and multi-turn rollouts on a mock transport.

The limits are real (RLIMIT_CPU, RLIMIT_AS, a wall timeout, a process group): a call that
loops forever, allocates 10 GB, sleeps past its timeout or leaves a forked child behind is
stopped, and its kind is reported; the rollout that made the call goes on.
"""

from __future__ import annotations

import os
import string
import time

import numpy as np
import pytest

import plexrl
from plexrl.client.mock import MockTransport
from plexrl.protocol import Function
from plexrl.rl.rollout import completion_text, episode_batch, rollout
from plexrl.rl.tasks import ToolArithTask
from plexrl.rl.tokenizers import CharTokenizer
from plexrl.rl.tools import Calculator, PythonTool, ToolBox, ToolLimits, run_in_child

FAST = ToolLimits(cpu_s=1, wall_s=2.0)
LOOP = ToolLimits(cpu_s=1, wall_s=20.0)    # the CPU limit, not the wall, stops a loop


@pytest.mark.parametrize(("argument", "kind", "text"), [
    ("37*58", "ok", "2146"),
    ("(1+2)**3 - 7//2", "ok", "24"),
    ("7/2", "ok", "3.5"),
    ("1/0", "error", "ZeroDivisionError: division by zero"),
    ("__import__('os').getpid()", "error", "ValueError: not arithmetic: Call"),
    ("9**9**9", "error", "ValueError: exponent 387420489 over 256"),
])
def test_the_calculator_walks_arithmetic_only(argument, kind, text):
    result = Calculator()(argument, FAST)
    assert (result.tool, result.kind, result.text) == ("calc", kind, text)


def test_a_call_that_loops_forever_is_stopped_by_its_cpu_limit():
    result = PythonTool()("while True: pass", LOOP)
    assert result.kind == "cpu" and result.wall_s < LOOP.wall_s
    assert "CPU" in result.text


def test_a_call_that_allocates_10_gb_is_refused_by_its_address_space_limit():
    result = PythonTool()("len(bytearray(10 * 2**30))", FAST)
    assert (result.kind, result.text) == ("memory", "MemoryError")
    assert PythonTool()("len(bytearray(10 * 2**20))", FAST).text == str(10 * 2**20)   # 10 MB fits


def test_a_call_past_its_wall_timeout_dies_with_its_whole_process_group():
    # the call forks a grandchild that would sleep on; both are in the call's process group
    code = ("import os, time\nwith open(%r, 'w') as f:\n    pid = os.fork()\n"
            "    if pid == 0:\n        time.sleep(60)\n    f.write(str(pid))\ntime.sleep(60)")
    limits = ToolLimits(cpu_s=1, wall_s=1.0)
    path = f"/tmp/plexrl-tool-test-{os.getpid()}"
    result = PythonTool()(code % path, limits)
    assert result.kind == "timeout" and 1.0 <= result.wall_s < 3.0
    grandchild = int(open(path).read())
    os.unlink(path)
    deadline = time.monotonic() + 5.0          # SIGKILL was sent; it lands asynchronously
    while _alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not _alive(grandchild)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: the orphan waits for init to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_signal_or_a_silent_exit_is_a_result_too():
    assert run_in_child("python", "import os\nos.kill(os.getpid(), 9)", FAST).kind == "killed"
    assert run_in_child("python", "import os\nos._exit(3)", FAST).kind == "crashed"
    assert PythonTool()("print('x' * 100)\nresult = 5", FAST).text == "5"   # prints are not it


def test_a_call_that_cannot_start_is_a_result(monkeypatch):
    def refuse(*args, **kwargs):
        raise BlockingIOError(11, "Resource temporarily unavailable")
    monkeypatch.setattr("plexrl.rl.tools.subprocess.Popen", refuse)
    result = Calculator()("1+1", FAST)
    assert result.kind == "crashed" and "not started" in result.text


def test_the_toolbox_parses_the_call_that_ends_a_turn():
    box = ToolBox((Calculator(), PythonTool()))
    assert box.parse("12[3*4]") == "3*4" and box.parse("[1][2+2]") == "2+2"
    assert box.parse("3*4]") is None and box.parse("[3*4") is None
    assert box.call("py:sum(range(5))").text == "10"       # a named tool
    assert box.call("2+3").tool == "calc"                  # the default tool
    assert box.render(box.call("2+3")) == "{5}"
    assert box.render(box.call("2+")) == "{error}"
    assert box.report.summary() == {"ok": 3, "error": 1}


class ScriptedModel:
    """A mock GENERATE: each row's next turn is a function of its context text."""

    def __init__(self, tokenizer, script):
        self.tok, self.script, self.turns = tokenizer, script, []

    def __call__(self, request):
        assert request.function is Function.GENERATE
        stop = set(request.option("stop"))
        n = request.max_tokens
        prompts = request.payload["prompts"]
        self.turns.append([self.tok.decode(p) for p in prompts])
        tokens = np.zeros((len(prompts), n), dtype=np.int64)
        lengths = np.zeros(len(prompts), dtype=np.int64)
        for i, prompt in enumerate(prompts):
            ids = self.tok.encode(self.script(self.tok.decode(prompt)), add_bos=False)
            ids = (ids + [self.tok.eos_id])[:n]
            cut = next((j + 1 for j, t in enumerate(ids) if t in stop), len(ids))
            tokens[i, :cut], lengths[i] = ids[:cut], cut
        logprobs = np.where(np.arange(n) < lengths[:, None], -0.5, 0.0).astype(np.float32)
        return {"tokens": tokens, "lengths": lengths, "logprobs": logprobs,
                "stopped": lengths < n, "version": request.version}


def _script(context: str) -> str:
    """Prompt "<code>=" -> a call of <code>; after a result, echo it and end."""
    if context.endswith("}"):
        return context.rsplit("{", 1)[1][:-1]
    return "[" + context[:-1].replace("@", "py:") + "]"


def test_a_rollout_calls_tools_and_goes_on_whatever_they_did():
    tok = CharTokenizer(string.ascii_letters + string.digits + " *+()[]{}=:@")
    model = ScriptedModel(tok, _script)
    job = plexrl.connect("mock", handler=model).register_job("tools", {"policy": None})
    box = ToolBox((Calculator(), PythonTool()), limits=FAST)
    prompts = ["37*58=", "@len(bytearray(10*2**30))=", "@max(1 for  in iter(int 1))=",
               "(1+2)**3="]
    episodes = rollout(job, tok, [tok.encode(p) for p in prompts], version=0, max_tokens=40,
                       toolbox=box, max_turns=3)
    texts = [completion_text(tok, e) for e in episodes]
    assert texts == ["[37*58]{2146}2146", "[py:len(bytearray(10*2**30))]{memory}memory",
                     "[py:max(1 for  in iter(int 1))]{error}error", "[(1+2)**3]{27}27"]
    assert box.report.summary() == {"ok": 2, "error": 1, "memory": 1}
    assert len(model.turns) == 2 and all(e.done and e.stopped for e in episodes)
    assert model.turns[1][0] == "37*58=[37*58]{2146}"        # the result is in the context
    batch = episode_batch(episodes, tok.pad_id)
    row = batch["loss_mask"][0]
    p = len(tok.encode(prompts[0]))
    sampled = [1] * len("[37*58]") + [0] * len("{2146}") + [1] * len("2146") + [1]  # + eos
    np.testing.assert_array_equal(row[p:p + len(sampled)], sampled)
    np.testing.assert_array_equal(batch["old_logprobs"][0][row > 0], -0.5)
    assert batch["old_logprobs"][0][row == 0].sum() == 0


def test_a_looping_tool_is_reported_and_the_rollout_continues():
    tok = CharTokenizer(string.ascii_letters + string.digits + " *+()[]{}=:@")
    model = ScriptedModel(tok, lambda c: "[py:1]" if c.endswith("=") else "ok")
    box = ToolBox((Calculator(), PythonTool(prelude="while 1:\n    pass")), limits=LOOP)
    job = plexrl.connect("mock", handler=model).register_job("loop", {"policy": None})
    episodes = rollout(job, tok, [tok.encode("a=")], version=0, max_tokens=10, toolbox=box,
                       max_turns=2)
    assert completion_text(tok, episodes[0]) == "[py:1]{cpu}ok"
    assert box.report.summary() == {"cpu": 1}


def test_without_tools_a_rollout_is_one_generate_and_the_turn_limit_holds():
    task = ToolArithTask()
    tok = CharTokenizer.for_tasks(task)
    always_calls = ScriptedModel(tok, lambda c: "[1+1]")
    job = plexrl.connect("mock", handler=always_calls).register_job("limit", {"policy": None})
    episodes = rollout(job, tok, [tok.encode("1+1=")], version=0, max_tokens=8)
    assert len(always_calls.turns) == 1 and completion_text(tok, episodes[0]) == "[1+1]"
    box = ToolBox(limits=FAST)
    episodes = rollout(job, tok, [tok.encode("1+1=")], version=0, max_tokens=8, toolbox=box,
                       max_turns=3)
    assert completion_text(tok, episodes[0]) == "[1+1]{2}[1+1]{2}[1+1]"
    assert episodes[0].turns == 3 and not episodes[0].stopped and box.report.num_calls == 2
    item = task.sample(1, 0)[0]
    assert task.score(item, task.transcript(item)) == 1.0
