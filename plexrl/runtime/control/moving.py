"""How the controller carries out the core's Moves, a mixin of the controller.

Owns: ``_moves_done`` (the Moves one planning cycle decided on a group go to its service in
one call, which runs them in order; each then lands as a ``TransitionFinished`` and in the
journal) and ``_move_failed`` (a failed move leaves the previous copy current; the core
plans it again, and a State whose move fails twice running ends its job). Uses the
controller's ``snap``, ``jobs``, ``journal``, ``executor``, ``_failed_moves``, ``_fold``,
``_plan``, ``_spawn``, ``_end_job``, ``_lost``. Must not know: how bytes move, scheduling.
"""

from __future__ import annotations

import time

import ray

from plexrl.core import events as ev
from plexrl.core.decisions import Move
from plexrl.errors import ServiceLost
from plexrl.protocol import State, Tier
from plexrl.runtime.workers.ranks import cause


class StateMoves:
    async def _moves_done(self, moves: list[Move]) -> None:
        """Moves decided together on one group, sent in one call; each lands, or fails with the
        previous copy still current (tiers/store.py), as if it had gone alone."""
        copied = [m for m in moves   # the KV cache is reserved per call (workspace), not copied
                  if m.key.state != State.KV_CACHE and Tier.DROPPED not in (m.src, m.dst)]
        answers: list = []
        if copied:
            try:
                answers = await self.executor.moves(copied[0].wg, copied)
            except ray.exceptions.RayActorError as err:
                self._lost(copied[0].wg, err)
                return
            except Exception as err:   # the call itself failed: every move of it did
                answers = [err] * len(copied)
        lost = [a for a in answers if isinstance(a, ServiceLost) and a.rank >= 0]
        if lost:   # a rank of the group died: the group is gone, not just these moves
            self._lost(copied[0].wg, lost[0], lost[0].rank)
            return
        answer_of = dict(zip(map(id, copied), answers))
        for move in moves:
            answer = answer_of.get(id(move), {"seconds": 0.0})
            if isinstance(answer, Exception):
                self._move_failed(move, answer)
                continue
            self._failed_moves.pop(move.key, None)
            self._fold(ev.TransitionFinished(key=move.key, src=move.src, dst=move.dst,
                                             num_bytes=move.num_bytes, at=time.monotonic(),
                                             duration_s=answer["seconds"]))
            view = self.snap.states.get(move.key)
            if view is not None and move.key.state != State.KV_CACHE:
                key = move.key
                self.journal.state(key, view.tier, view.version)
        self._plan()

    def _move_failed(self, move: Move, err: Exception) -> None:
        """Undo the assumed move (the State stays where it was) and let the core plan it
        again; a State whose move fails twice running ends its job with the error."""
        if move.key not in self.snap.states:
            return
        self._fold(ev.TransitionFinished(key=move.key, src=move.src, dst=move.src, num_bytes=0,
                                         at=time.monotonic(), duration_s=0.0))
        self._failed_moves[move.key] = self._failed_moves.get(move.key, 0) + 1
        record = self.jobs.get(move.key.job)
        if self._failed_moves[move.key] >= 2 and record is not None:
            self._failed_moves.pop(move.key)
            self._spawn(self._end_job(move.key.job, record, cause(err)))
        else:
            self._plan()
