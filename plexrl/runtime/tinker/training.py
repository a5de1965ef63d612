"""A Tinker training client as a PlexRL job, and its sampling sessions and checkpoints.

Owns: ``TinkerModel`` (one ``create_model``: the PlexRL job that runs it, through a
``JobClient`` like any program's; its calls issued in the SDK's ``seq_id`` order whatever
order they arrive in, so the job's call order, and so its results, are the SDK's; the
trainer version its calls have reached), ``Sampler`` (a sampling session: a model at the
weight version a ``save_weights_for_sampler`` installed; its samples issued in its own
``seq_id`` order), ``Checkpoint`` (a ``tinker://`` path: the file ``save`` wrote, whose
key it is, what model it holds) and the Tinker path format.
Must not know: HTTP, the wire format, scheduling.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path

from plexrl.client.job import JobClient
from plexrl.runtime.tinker.futures import UserError

SCHEME = "tinker://"


class Turns:
    """Lets calls numbered ``first, first + 1, ...`` through one at a time, in number order."""

    def __init__(self, first: int):
        self.next = first
        self._waiting: dict[int, asyncio.Event] = {}

    async def wait(self, seq: int) -> None:
        if seq < self.next:
            raise UserError(f"seq_id {seq} was used already (next is {self.next}); fix: one "
                            "client per model, as the SDK numbers its calls")
        if seq > self.next:
            await self._waiting.setdefault(seq, asyncio.Event()).wait()

    def done(self) -> None:
        self._waiting.pop(self.next, None)
        self.next += 1
        event = self._waiting.get(self.next)
        if event is not None:
            event.set()


def checked(turns: Turns, seq, check):
    """``check()``'s value; if it raises, the call numbered ``seq`` still takes its turn
    (doing nothing), so the calls after it are not held up waiting for it."""
    try:
        return check()
    except Exception:
        if isinstance(seq, int) and seq >= turns.next:
            asyncio.ensure_future(in_turn(turns, seq, lambda: None))
        raise


async def in_turn(turns: Turns, seq: int, issue) -> Future:
    """Issue ``issue()`` (it returns the job's future at once) when ``seq``'s turn comes;
    the turn passes on even if issuing fails."""
    await turns.wait(seq)
    try:
        return issue()
    finally:
        turns.done()


@dataclass
class TinkerModel:
    model_id: str
    key: str
    session_id: str
    base_model: str
    rank: int
    seed: int
    vocab_size: int
    job: JobClient
    arch: str = ""
    parts: tuple[str, ...] = ()          #: the LoRA parts adapted (attn, mlp, unembed)
    turns: Turns = field(default_factory=lambda: Turns(1))
    version: int = 0                     #: trainer weight version issued so far
    synced: int = 0                      #: the version its rollout copy was last given
    requests: dict[int, str] = field(default_factory=dict)   #: seq_id -> request id (resends)
    ended: bool = False

    def info(self) -> dict:
        """``get_info``'s reply (``GetInfoResponse``)."""
        return {"type": "get_info", "model_id": self.model_id, "model_name": self.base_model,
                "is_lora": True, "lora_rank": self.rank,
                "model_data": {"arch": self.arch, "model_name": self.base_model,
                               "tokenizer_id": self.base_model}}


@dataclass
class Sampler:
    sampler_id: str
    key: str
    model: TinkerModel
    version: int                         #: the weight version its samples are drawn from
    model_path: str = ""
    turns: Turns = field(default_factory=lambda: Turns(0))
    requests: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Checkpoint:
    path: str                            #: tinker://<model_id>/<kind>/<name>
    file: str
    key: str
    model_id: str
    base_model: str
    rank: int
    seed: int
    version: int                         #: the trainer version it holds
    parts: tuple[str, ...] = ()

    def record(self) -> None:
        Path(self.file + ".json").write_text(json.dumps(asdict(self)))

    def weights_info(self) -> dict:
        """``weights_info``'s reply (``WeightsInfoResponse``)."""
        return {"base_model": self.base_model, "is_lora": True, "lora_rank": self.rank}


def tinker_path(model_id: str, kind: str, name: str) -> str:
    return f"{SCHEME}{model_id}/{kind}/{name}"


def check_name(name) -> str:
    """A checkpoint name the SDK's path format keeps whole (no ``/``)."""
    if not isinstance(name, str) or not name or "/" in name or name in (".", ".."):
        raise UserError(f"checkpoint name {name!r} is not a plain name; fix: a non-empty name "
                        "without '/'")
    return name
