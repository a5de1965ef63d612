"""Verifiable tasks: the ``Task`` protocol and its sources.

    base.py     Item, Task, the held-out split rule shared by every source
    digits.py   own generators for tiny models (copy / reverse / add digit strings)
    gym.py      a reasoning-gym dataset, scored by its own ``score_answer``
    math.py     math word problems from JSONL (``\\boxed{}`` / ``####`` answers)
    tooluse.py  arithmetic answered with a calculator tool (multi-turn rollouts)

Must not know: the client, tokenizers, models.
"""

from plexrl.rl.tasks.base import Item, Task, in_heldout
from plexrl.rl.tasks.digits import DigitTask
from plexrl.rl.tasks.math import MathTask
from plexrl.rl.tasks.tooluse import ToolArithTask

__all__ = ["DigitTask", "Item", "MathTask", "Task", "ToolArithTask", "in_heldout"]
