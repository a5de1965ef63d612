"""RLVR written only against ``plexrl.client``: GRPO/DAPO, PPO, tool use, tasks and rewards.

    grpo.py        GRPOConfig, advantages, DAPO filters, batch builder, ``train``, evaluation
    ppo.py         PPO with a value model and a frozen reference: token rewards, GAE, ``train``
    rollout.py     multi-turn rollouts: GENERATE per turn, tool calls between turns
    tools.py       tool calls in limited child processes (tool_child.py), ToolBox, ToolReport
    sft.py         a short supervised warm-up (cross-entropy) before GRPO
    rewards.py     reward functions called as TRL calls them, with weights
    tokenizers.py  a character tokenizer for tiny models; Hugging Face tokenizers from disk
    tasks/         the Task protocol; digit tasks, reasoning-gym, JSONL math

Owns: the control logic a job keeps (data, rewards, the algorithm loop). Must not import
``plexrl.runtime``, ``plexrl.sim``, ray or torch, so the same algorithm runs on Ray, in the
simulator, or on a mock transport.
"""
