"""A tool stall on the local runtime: while job A waits on its tools, job B's calls run on
the same worker group, and a Perfetto timeline of the call log shows them on one track."""

from __future__ import annotations

import json
import threading

from plexrl.demo.artifacts import write_timeline
from plexrl.rl.rollout import completion_text, rollout
from plexrl.rl.sft import supervised_warmup
from plexrl.rl.tasks import DigitTask, ToolArithTask
from plexrl.rl.tasks.tooluse import TranscriptTask
from plexrl.rl.tokenizers import CharTokenizer
from plexrl.rl.tools import PythonTool, ToolBox, ToolLimits
from plexrl.runtime.models import model_spec

STALL_S = 1.0


def test_another_jobs_calls_run_on_the_worker_group_while_a_job_waits_on_its_tools(connect,
                                                                                   tmp_path):
    runtime = connect(groups=(("wg0", 1),))
    spec = model_spec("policy", source="tiny-qwen2")
    task = ToolArithTask()
    tok = CharTokenizer.for_tasks(task)
    a = runtime.register_job("tool-a", {"policy": spec}, seed=0)
    b = runtime.register_job("busy-b", {"policy": spec}, seed=1)
    _, version = supervised_warmup(a, TranscriptTask(task), tok, 20, batch_size=32, lr=3e-3)

    stop = threading.Event()
    copy = DigitTask("copy", 2, 3)
    b_prompts = [tok.encode(it.prompt) for it in copy.sample(8, seed=1)]

    def keep_b_busy():
        while not stop.is_set():
            b.generate(b_prompts, step=0, max_tokens=4).result()

    # a calculator that takes STALL_S to answer (the sleep runs in the limited child)
    slow = PythonTool(name="calc", prelude=f"import time\ntime.sleep({STALL_S})")
    box = ToolBox((slow,), limits=ToolLimits(wall_s=10.0), max_parallel=16)
    busy = threading.Thread(target=keep_b_busy)
    busy.start()
    try:
        items = task.sample(16, seed=3)
        episodes = rollout(a, tok, [tok.encode(it.prompt) for it in items], version=version,
                           max_tokens=12, toolbox=box, max_turns=2, temperature=0.0)
    finally:
        stop.set()
        busy.join()
    print("\n" + " | ".join(completion_text(tok, e) for e in episodes[:4]), box.report.summary())
    assert box.report.counts["ok"] >= 1

    calls = runtime.inspect("calls")
    a_gen = sorted((c for c in calls if c["job"] == "tool-a" and c["function"] == "generate"),
                   key=lambda c: c["start_s"])
    assert len(a_gen) == 2                                   # one GENERATE per turn
    stall = (a_gen[0]["end_s"], a_gen[1]["start_s"])         # A issued nothing in between
    assert stall[1] - stall[0] >= STALL_S
    inside = [c for c in calls if c["job"] == "busy-b"
              and stall[0] <= c["start_s"] and c["end_s"] <= stall[1]]
    print(f"A's tool stall {stall[1] - stall[0]:.2f} s: {len(inside)} of B's calls ran in it")
    assert inside and all(c["wg"] == a_gen[0]["wg"] == "wg0" for c in inside)

    trace = json.loads(write_timeline(tmp_path / "timeline.json", calls).read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    track_of = {e["name"].split()[0]: e["tid"] for e in spans}
    assert track_of["tool-a"] == track_of["busy-b"]
    origin = min(c["start_s"] for c in calls)
    lo, hi = round((stall[0] - origin) * 1e6), round((stall[1] - origin) * 1e6)
    b_in_stall = [e for e in spans if e["name"].startswith("busy-b")
                  and lo <= e["ts"] and e["ts"] + e["dur"] <= hi + 1]
    assert b_in_stall and {e["tid"] for e in b_in_stall} == {track_of["tool-a"]}
    a.end()
    b.end()
