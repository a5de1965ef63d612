"""The controller's journal: its control state, durable in one SQLite file (WAL mode).

Owns: the file ``<state_dir>/controller.sqlite`` and its tables -- ``jobs`` (each job's
request, token, status and the session that ran it), ``bindings`` (which worker group holds
each model copy), ``states`` (each State's tier and version, as last folded), ``calls`` (one
row per call of a job, keyed by its call id ``(job, seq)``: written when the call arrives, and
again just BEFORE it is dispatched, with its controller id, copy order and worker group),
``outcomes`` (append-only: one terminal record per call, written after it ran, failed or was
refused) and ``checkpoints`` (a job's durable copies on disk: SAVE files and the runtime's
own checkpoints every ``save_interval`` versions). Every write commits before the method
returns, so what the controller acknowledged survives its process.
Must not know: Ray, torch, the core's Snapshot, how a call runs.
"""

from __future__ import annotations

import pickle
import sqlite3
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from plexrl.protocol import CallRequest, JobRequest, StateKey, copy_label, split_copy_id

FILE_NAME = "controller.sqlite"
TERMINAL = ("done", "failed", "refused", "cancelled")   #: statuses a call ends in

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS jobs (job TEXT PRIMARY KEY, request BLOB, token TEXT, status TEXT,
    session TEXT, created_at REAL, ended_at REAL, reason TEXT);
CREATE TABLE IF NOT EXISTS bindings (job TEXT, role TEXT, copy TEXT, wg TEXT,
    PRIMARY KEY (job, role, copy));
CREATE TABLE IF NOT EXISTS states (job TEXT, role TEXT, copy TEXT, state TEXT, tier TEXT,
    version INTEGER, PRIMARY KEY (job, role, copy, state));
CREATE TABLE IF NOT EXISTS calls (job TEXT, seq INTEGER, request BLOB, status TEXT,
    call INTEGER, copy_seq INTEGER, wg TEXT, submitted_at REAL, dispatched_at REAL,
    ended_at REAL, PRIMARY KEY (job, seq));
CREATE TABLE IF NOT EXISTS outcomes (job TEXT, seq INTEGER, status TEXT, error TEXT, at REAL);
CREATE TABLE IF NOT EXISTS checkpoints (job TEXT, role TEXT, version INTEGER, path TEXT,
    at REAL, PRIMARY KEY (job, role, version));
"""


@dataclass(frozen=True)
class JournaledJob:
    job: str
    request: JobRequest
    token: str
    status: str                  #: "placing", "running", "ended" or "interrupted"
    session: str


@dataclass(frozen=True)
class JournaledCall:
    job: str
    seq: int
    request: CallRequest         #: without its payload
    status: str                  #: "submitted", "dispatched", or one of TERMINAL
    call: int | None             #: the controller's call id once queued
    copy_seq: int | None
    wg: str | None


@dataclass(frozen=True)
class Checkpoint:
    job: str
    role: str
    version: int                 #: trainer weight version the file holds
    path: str


class Journal:
    """One controller's durable control state; ``path`` is created if missing."""

    def __init__(self, state_dir: str | Path):
        self.dir = Path(state_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / FILE_NAME
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        self._db.close()

    @property
    def mode(self) -> str:
        return self._db.execute("PRAGMA journal_mode").fetchone()[0]

    # -- sessions -----------------------------------------------------------------------------
    def get(self, key: str, default: str | None = None) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else row[0]

    def put(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, value))

    def interrupt(self, session: str) -> list[str]:
        """Jobs of other sessions that never ended: their cluster went away (whole-cluster
        restart). They become "interrupted"; their checkpoints stay. Returns their names."""
        rows = self._db.execute("SELECT job FROM jobs WHERE session != ? AND status IN "
                                "('placing', 'running')", (session,)).fetchall()
        with self._db:
            for (job,) in rows:
                self._end(job, "interrupted", "the cluster restarted")
        return [job for (job,) in rows]

    # -- jobs ---------------------------------------------------------------------------------
    def add_job(self, request: JobRequest, token: str, session: str) -> None:
        """A job registered. An earlier job of that name (it ended) keeps its calls, checkpoints
        and outcomes under ``<name>#<its token's first 8 characters>``."""
        with self._db:
            old = self._db.execute("SELECT token FROM jobs WHERE job = ?",
                                   (request.job,)).fetchone()
            if old is not None:
                renamed = f"{request.job}#{old[0][:8]}"
                for table in ("calls", "outcomes", "checkpoints"):
                    self._db.execute(f"UPDATE {table} SET job = ? WHERE job = ?",
                                     (renamed, request.job))
            self._db.execute("INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, 'placing', ?, ?, NULL, "
                             "'')", (request.job, pickle.dumps(request), token, session,
                                     time.time()))

    def bind(self, job: str, groups: dict) -> None:
        """The job is placed and bound: its copies' worker groups (``copy_id`` keys; a lane's
        copy is written as ``copy_label`` does)."""
        rows = []
        for key, wg in groups.items():
            role, copy, lane = split_copy_id(key)
            rows.append((job, str(role), copy_label(copy, lane), wg))
        with self._db:
            self._db.executemany("INSERT OR REPLACE INTO bindings VALUES (?, ?, ?, ?)", rows)
            self._db.execute("UPDATE jobs SET status = 'running' WHERE job = ?", (job,))

    def end_job(self, job: str, reason: str, status: str = "ended") -> None:
        with self._db:
            self._end(job, status, reason)

    def _end(self, job: str, status: str, reason: str) -> None:
        now = time.time()
        self._db.execute("UPDATE jobs SET status = ?, ended_at = ?, reason = ? WHERE job = ?",
                         (status, now, reason[:500], job))
        self._db.execute("DELETE FROM bindings WHERE job = ?", (job,))
        self._db.execute("DELETE FROM states WHERE job = ?", (job,))
        open_calls = self._db.execute(
            f"SELECT seq FROM calls WHERE job = ? AND status NOT IN {TERMINAL}", (job,)).fetchall()
        for (seq,) in open_calls:
            self._finish(job, seq, "cancelled", reason, now)

    def jobs(self, *statuses: str) -> list[JournaledJob]:
        rows = self._db.execute("SELECT job, request, token, status, session FROM jobs "
                                "ORDER BY created_at").fetchall()
        return [JournaledJob(j, pickle.loads(r), t, s, sess) for j, r, t, s, sess in rows
                if not statuses or s in statuses]

    def bindings(self, job: str) -> dict[tuple[str, str], str]:
        return {(r, c): wg for r, c, wg in self._db.execute(
            "SELECT role, copy, wg FROM bindings WHERE job = ?", (job,))}

    # -- states -------------------------------------------------------------------------------
    def state(self, key: StateKey, tier: str, version: int) -> None:
        self._db.execute("INSERT OR REPLACE INTO states VALUES (?, ?, ?, ?, ?, ?)",
                         (key.job, str(key.role), copy_label(key.copy, key.lane), str(key.state),
                          str(tier), version))

    def states(self, job: str) -> dict[tuple[str, str, str], tuple[str, int]]:
        return {(r, c, s): (t, v) for r, c, s, t, v in self._db.execute(
            "SELECT role, copy, state, tier, version FROM states WHERE job = ?", (job,))}

    # -- calls --------------------------------------------------------------------------------
    def submitted(self, request: CallRequest) -> bool:
        """Record a call on arrival (its payload is not kept); False if its call id
        ``(job, seq)`` is recorded already."""
        cur = self._db.execute(
            "INSERT OR IGNORE INTO calls VALUES (?, ?, ?, 'submitted', NULL, NULL, NULL, ?, NULL, "
            "NULL)", (request.job, request.seq, pickle.dumps(request), time.time()))
        return cur.rowcount == 1

    def dispatching(self, job: str, seq: int, call: int, copy_seq: int, wg: str) -> None:
        """Recorded BEFORE the go is sent."""
        self._db.execute("UPDATE calls SET status = 'dispatched', call = ?, copy_seq = ?, wg = ?, "
                         "dispatched_at = ? WHERE job = ? AND seq = ?",
                         (call, copy_seq, wg, time.time(), job, seq))

    def queued(self, job: str, seq: int, call: int, copy_seq: int) -> None:
        self._db.execute("UPDATE calls SET call = ?, copy_seq = ? WHERE job = ? AND seq = ?",
                         (call, copy_seq, job, seq))

    def finish(self, job: str, seq: int, status: str, error: str = "") -> bool:
        """The call's terminal record, once: False (and nothing written) if it has one."""
        with self._db:
            return self._finish(job, seq, status, error, time.time())

    def _finish(self, job: str, seq: int, status: str, error: str, now: float) -> bool:
        assert status in TERMINAL, status
        cur = self._db.execute(f"UPDATE calls SET status = ?, ended_at = ? WHERE job = ? AND "
                               f"seq = ? AND status NOT IN {TERMINAL}", (status, now, job, seq))
        if cur.rowcount != 1:
            return False
        self._db.execute("INSERT INTO outcomes VALUES (?, ?, ?, ?, ?)",
                         (job, seq, status, error[:500], now))
        return True

    def call(self, job: str, seq: int) -> JournaledCall | None:
        rows = self._calls("WHERE job = ? AND seq = ?", (job, seq))
        return rows[0] if rows else None

    def calls(self, job: str | None = None) -> list[JournaledCall]:
        if job is None:
            return self._calls("ORDER BY job, seq", ())
        return self._calls("WHERE job = ? ORDER BY seq", (job,))

    def _calls(self, where: str, args: tuple) -> list[JournaledCall]:
        rows = self._db.execute("SELECT job, seq, request, status, call, copy_seq, wg FROM calls "
                                + where, args).fetchall()
        return [JournaledCall(j, s, pickle.loads(r), st, c, cs, wg)
                for j, s, r, st, c, cs, wg in rows]

    def outcomes(self) -> list[tuple[str, int, str]]:
        """Every terminal record, in the order written: (job, seq, status)."""
        return [tuple(r) for r in self._db.execute(
            "SELECT job, seq, status FROM outcomes ORDER BY rowid")]

    def max_call_id(self) -> int:
        row = self._db.execute("SELECT MAX(call) FROM calls").fetchone()
        return -1 if row[0] is None else row[0]

    # -- checkpoints --------------------------------------------------------------------------
    def checkpoint(self, job: str, role: str, version: int, path: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO checkpoints VALUES (?, ?, ?, ?, ?)",
                         (job, role, version, path, time.time()))

    def last_checkpoint(self, job: str, role: str = "policy") -> Checkpoint | None:
        row = self._db.execute("SELECT version, path FROM checkpoints WHERE job = ? AND role = ? "
                               "ORDER BY version DESC, at DESC LIMIT 1", (job, role)).fetchone()
        return None if row is None else Checkpoint(job, role, row[0], row[1])


def state_dir(config, session: str) -> str:
    """Where the controller's journal and checkpoints live: ``config.state_dir``, else a
    directory of this session's own under the system's temporary directory."""
    return config.state_dir or str(Path(tempfile.gettempdir()) / f"plexrl-state-{session}")
