"""The isolated baseline record: what it is stamped with, writing it, and checking it.

Owns: ``code_version`` (the package version plus a blake2b of every ``plexrl/**/*.py``;
``git describe`` is recorded beside it for people, not compared, so a commit that touches
no source keeps a record valid), ``stamp`` (code version, config hash, seeds), ``write_record``, ``load_record`` (a ConfigError naming each field that
differs from this run's stamp, or saying how to make one when there is none).
Must not know: the runtime, how jobs run.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import plexrl
from plexrl.demo.plan import config_hash
from plexrl.errors import ConfigError

RECORD = "baseline-isolated.json"
PACKAGE = Path(plexrl.__file__).resolve().parent


def source_hash() -> str:
    digest = hashlib.blake2b(digest_size=8)
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def code_version() -> str:
    return f"{plexrl.__version__}+src.{source_hash()}"


def git_describe() -> str:
    try:
        described = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=PACKAGE,
                                   capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        described = ""
    return described or "unknown"


def stamp(jobs, *, version: str | None = None, devices: int = 1) -> dict:
    """What a record must match: the code, the jobs, their seeds and the group's devices."""
    return {"code_version": version or code_version(), "config_hash": config_hash(jobs),
            "seeds": {j.name: j.seed for j in jobs}, "devices": devices}


def write_record(out: Path, this_stamp: dict, body: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / RECORD
    path.write_text(json.dumps({"stamp": this_stamp, "git_describe": git_describe(), **body}, indent=1, sort_keys=True))
    return path


def load_record(out: Path, this_stamp: dict, command: str) -> dict | None:
    """The record in ``out`` if its stamp matches ``this_stamp``; None when there is none;
    a ConfigError naming what differs when it does not match."""
    path = out / RECORD
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    theirs = record.get("stamp", {})
    differs = [key for key in this_stamp if theirs.get(key) != this_stamp[key]]
    if differs:
        detail = "; ".join(f"{k}: record {theirs.get(k)!r}, this run {this_stamp[k]!r}"
                           for k in differs)
        raise ConfigError(f"the isolated record does not match this run ({detail})",
                          file=str(path), field=",".join(differs),
                          fix=f"re-record it: {command} --isolated --record")
    return record
