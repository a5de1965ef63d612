"""LoRA in the core's byte model (D215): a job's States are its adapters'; its frozen base is
one BASE State per worker group and base, shared by every LoRA job bound there.

Sizes (core_builders): a device holds 1000 bytes; a base of 350 parameters holds 700, a job's
adapters of 10 parameters WEIGHTS 20, GRADS 40, OPTIMIZER 120. The base and one job's
adapters fit on the device at once; the base and two jobs' do not.
"""

from __future__ import annotations

from dataclasses import replace

from core_builders import admitted, dispatch, model, one_group, queue, with_tiers

from plexrl.core import apply, plan
from plexrl.core import events as ev
from plexrl.core.decisions import Dispatch, Move
from plexrl.core.invariants import check_step
from plexrl.core.jobs import JobSpec, ModelDecl
from plexrl.core.transitions import needed_keys
from plexrl.protocol import BASE_OWNER, Copy, Function, Role, State, StateKey, Tier, base_key


def lora_job(job: str, base: str = "qwen", base_params: float = 350) -> JobSpec:
    spec = replace(model(10), lora_rank=4, base=base, base_params=base_params,
                   active_params=base_params)
    decl = ModelDecl(Role.POLICY, spec, (Copy.TRAINER,))
    return JobSpec(job=job, models=(decl,), candidates=((Role.POLICY, Copy.TRAINER, ("g0",)),))


def own(job: str, state: State) -> StateKey:
    return StateKey(job, Role.POLICY, Copy.TRAINER, state)


BASE = base_key("qwen", "g0")


def test_jobs_on_one_base_hold_it_once_and_their_adapters_each():
    snap = admitted(one_group(), lora_job("a"), lora_job("b"), lora_job("c"))
    bases = [k for k in snap.states if k.state == State.BASE]
    assert bases == [BASE] and BASE.job.startswith(BASE_OWNER)
    assert snap.states[BASE].num_bytes == 700
    for job in "abc":
        assert [snap.states[own(job, s)].num_bytes
                for s in (State.WEIGHTS, State.GRADS, State.OPTIMIZER)] == [20, 40, 120]
    other = admitted(one_group(), lora_job("a"), lora_job("d", base="llama", base_params=100))
    assert {k for k in other.states if k.state == State.BASE} == {BASE, base_key("llama", "g0")}


def test_a_forward_needs_the_base_and_an_optimizer_step_does_not():
    snap = admitted(one_group(), lora_job("a"))
    snap = queue(snap, 1, "a", 0, Function.FORWARD_BACKWARD)
    snap = queue(snap, 2, "a", 1, Function.OPTIM_STEP)
    forward, step = snap.queued
    assert BASE in needed_keys(snap, forward) and BASE not in needed_keys(snap, step)
    moves = [d for d in plan(snap, 0.0) if isinstance(d, Move)]
    assert {m.key for m in moves} == {BASE, own("a", State.WEIGHTS), own("a", State.GRADS),
                                      own("a", State.OPTIMIZER)}


def test_a_switch_between_lora_jobs_moves_adapters_and_keeps_the_base():
    snap = admitted(one_group(), lora_job("a"), lora_job("b"))
    resident = {k: Tier.DEVICE for k in snap.states if k.job in ("a",) or k == BASE}
    snap = with_tiers(snap, resident)
    snap = queue(snap, 1, "b", 0, Function.FORWARD_BACKWARD)
    moves = [d for d in plan(snap, 0.0) if isinstance(d, Move)]
    assert moves and all(m.key.job == "a" and m.dst == Tier.HOST for m in moves)   # a out
    for move in moves:
        snap = apply(snap, ev.TransitionFinished(key=move.key, src=move.src, dst=move.dst,
                                                 num_bytes=move.num_bytes, at=1.0,
                                                 duration_s=1.0))
    moves = [d for d in plan(snap, 1.0) if isinstance(d, Move)]
    assert {m.key.job for m in moves} == {"b"} and all(m.dst == Tier.DEVICE for m in moves)
    assert snap.states[BASE].tier == Tier.DEVICE                    # never moved
    for move in moves:
        snap = apply(snap, ev.TransitionFinished(key=move.key, src=move.src, dst=move.dst,
                                                 num_bytes=move.num_bytes, at=2.0,
                                                 duration_s=1.0))
    started = dispatch(snap, 1, 2.0)
    assert not check_step(snap, started)                            # ISOLATION: the base is b's to read
    decision = next(d for d in plan(snap, 2.0) if isinstance(d, Dispatch))
    assert BASE in decision.uses


def test_the_base_lives_while_a_job_on_it_does():
    snap = admitted(one_group(), lora_job("a"), lora_job("b"))
    snap = apply(snap, ev.JobEnded(job="a", at=1.0))
    assert BASE in snap.states
    snap = apply(snap, ev.JobEnded(job="b", at=2.0))
    assert not snap.states
