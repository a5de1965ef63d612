"""Job files: what a team member hands ``plexrl submit``, in TOML or YAML.

Owns: the schema of a job file (name, entry point, models with their ModelSpec fields and
resources, priority, seed, staleness, save interval, env), its validation (every error a
``ConfigError`` naming the file, the field, the value and the fix), and ``Submission``: the
frozen message the CLI sends the controller (a ``JobRequest``, the child's argv, env and
working directory). Relative paths resolve against the job file's directory. Must not know:
Ray, how the controller runs the entry point, scheduling.

A job file (``examples/jobs/own-job.toml`` ships one)::

    name = "my-job"                 # job id: letters, digits, '-', '_', '.'
    priority = 0                    # higher is admitted first and weights HRRS
    seed = 0
    staleness = 0                   # 0 on-policy, 1 one step off-policy
    save_interval = 0               # steps between disk checkpoints (0: never)
    rollout_lanes = 1               # rollout copy as this many lanes on shared rollout groups
    rollout_split = "rows"          # a GENERATE over the lanes: "rows" or "calls"
    [entry]                         # exactly one of command / module / file
    file = "../own_job.py"          # run with the controller's Python
    args = ["--steps", "3"]
    [env]
    OMP_NUM_THREADS = "1"
    [models.policy]                 # one table per role
    source = "tiny-qwen2"           # a built-in config or a local checkpoint directory
    head = "lm"
    [models.policy.resources]
    devices = 1                     # devices of the trainer copy (tp * pp * dp)
    device_bytes = "64MiB"          # what one device of it may hold at most
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from plexrl.errors import ConfigError
from plexrl.protocol import JobId, JobRequest, ModelSpec, Role

TOP = {"name", "priority", "seed", "staleness", "save_interval", "rollout_lanes",
       "rollout_split", "entry", "env", "models", "workdir"}
ENTRY = {"command", "module", "file", "args"}
#: ModelSpec fields a job file may set (sizes derive from the source)
MODEL = {"source": str, "head": str, "trainable": bool, "optimizer": str, "tp": int, "pp": int,
         "rollout_tp": int}
RESOURCES = {"devices", "device_bytes"}
ROLES = tuple(r.value for r in Role)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20,
          "GIB": 2**30}


@dataclass(frozen=True)
class Submission:
    """What ``plexrl submit`` sends the controller: the job and how to start its program."""

    request: JobRequest
    argv: tuple[str, ...]                 #: the child's command line
    cwd: str                              #: its working directory (absolute)
    env: tuple[tuple[str, str], ...] = ()  #: added to the controller's environment
    device_bytes: tuple[tuple[str, int], ...] = ()  #: per role: bytes one device may hold
    devices: tuple[tuple[str, int], ...] = ()       #: per role: devices of the trainer copy
    save_interval: int = 0                #: steps between disk checkpoints (0: never)
    source_file: str = ""                 #: the job file it came from


@dataclass(frozen=True)
class JobFile:
    """A validated job file; ``submission`` turns it into what the controller takes."""

    path: Path
    name: str
    argv: tuple[str, ...]
    cwd: Path
    models: tuple[tuple[str, dict], ...]          #: role -> ModelSpec fields
    devices: tuple[tuple[str, int], ...]
    device_bytes: tuple[tuple[str, int], ...]
    priority: int = 0
    seed: int = 0
    staleness: int = 0
    save_interval: int = 0
    rollout_lanes: int = 1
    rollout_split: str = "rows"
    env: tuple[tuple[str, str], ...] = field(default=())

    def submission(self) -> Submission:
        """Build each model's ModelSpec from its source (imports torch; a bad source is a
        ConfigError naming this file) and the message for the controller. A module or file
        entry runs with the controller's Python (``{python}`` in ``argv``)."""
        from plexrl.runtime.models import model_spec
        models = []
        for role, fields in self.models:
            kw = dict(fields)
            source = kw.pop("source")
            devices = dict(self.devices).get(role)
            try:
                spec = model_spec(role, source=source, **kw)
                if devices is not None:
                    spec = _with_devices(spec, devices)
            except ConfigError as err:
                raise ConfigError(_bare(err), file=str(self.path),
                                  field=f"models.{role}.{err.field or 'source'}",
                                  value=err.value, fix=err.fix) from None
            models.append((Role(role), spec))
        request = JobRequest(JobId(self.name), tuple(models), staleness=self.staleness,
                             seed=self.seed, priority=self.priority,
                             rollout_lanes=self.rollout_lanes, rollout_split=self.rollout_split)
        return Submission(request=request, argv=self.argv, cwd=str(self.cwd), env=self.env,
                          device_bytes=self.device_bytes, devices=self.devices,
                          save_interval=self.save_interval, source_file=str(self.path))


def load_job_file(path: str | Path) -> JobFile:
    """Read and validate a job file (``.toml``, ``.yaml`` or ``.yml``)."""
    path = Path(path).resolve()
    fail = _failer(path)
    if not path.is_file():
        raise ConfigError("no such job file", file=str(path), value=str(path),
                          fix="pass the path of a .toml or .yaml job file")
    text = path.read_text()
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            raw = tomllib.loads(text)
        elif suffix in (".yaml", ".yml"):
            import yaml
            raw = yaml.safe_load(text)
        else:
            fail("", suffix, "a job file is TOML or YAML", "name it *.toml, *.yaml or *.yml")
    except (tomllib.TOMLDecodeError, ImportError) as err:
        fail("", None, f"cannot parse: {err}", "fix the syntax")
    except Exception as err:   # yaml.YAMLError: yaml is imported lazily
        fail("", None, f"cannot parse: {err}", "fix the syntax")
    if not isinstance(raw, dict):
        fail("", type(raw).__name__, "a job file is a table of fields", "start with name = ...")
    _unknown(fail, "", raw, TOP)
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        fail("name", name, "a job needs a name of letters, digits, '-', '_' or '.' "
             "(at most 64, starting with a letter or digit)", 'set name = "my-job"')
    ints = {k: _int(fail, k, raw.get(k, 0)) for k in ("priority", "seed", "staleness",
                                                        "save_interval")}
    if ints["staleness"] not in (0, 1):
        fail("staleness", ints["staleness"], "staleness must be 0 or 1",
             "0: on-policy; 1: one step off-policy")
    if ints["save_interval"] < 0:
        fail("save_interval", ints["save_interval"], "a save interval is a number of steps",
             "use 0 (never) or a positive number of steps")
    ints["rollout_lanes"] = _int(fail, "rollout_lanes", raw.get("rollout_lanes", 1))
    if ints["rollout_lanes"] < 1:
        fail("rollout_lanes", ints["rollout_lanes"], "a rollout copy has at least one lane",
             "1 (one rollout copy), or how many rollout groups share its GENERATEs")
    split = raw.get("rollout_split", "rows")
    if split not in ("rows", "calls"):
        fail("rollout_split", split, "rollout_split is rows or calls",
             'rows: each lane samples its share of the rows; calls: each GENERATE goes whole '
             'to one lane in turn')
    cwd = path.parent
    if "workdir" in raw:
        workdir = raw["workdir"]
        if not isinstance(workdir, str) or not (cwd / workdir).is_dir():
            fail("workdir", workdir, "no such directory", "name a directory, relative to the "
                 "job file's")
        cwd = (cwd / workdir).resolve()
    argv = _entry(fail, raw.get("entry"), cwd)
    env = raw.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, (str, int, float)) for v in env.values()):
        fail("env", env, "env is a table of NAME = \"value\"", 'write [env] then NAME = "value"')
    bad = [k for k in env if k.startswith("PLEXRL_")]
    if bad:
        fail(f"env.{bad[0]}", env[bad[0]], "PLEXRL_* variables are set by the controller",
             "remove it")
    models, devices, device_bytes = _models(fail, raw.get("models"))
    return JobFile(path=path, name=name, argv=argv, cwd=cwd, models=models, devices=devices,
                   device_bytes=device_bytes, env=tuple((k, str(v)) for k, v in env.items()),
                   rollout_split=split, **ints)


def parse_bytes(value) -> int | None:
    """``123``, ``"64MiB"``, ``"1.5 GB"`` as bytes; None when it is not a size."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if not isinstance(value, str):
        return None
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*", value)
    if not match or match.group(2).upper() not in _UNITS:
        return None
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def _failer(path: Path):
    def fail(where: str, value, why: str, fix: str):
        raise ConfigError(why, file=str(path), field=where, value=value, fix=fix)
    return fail


def _unknown(fail, prefix: str, table: dict, allowed: set) -> None:
    for key in table:
        if not prefix and key in ENTRY:
            fail(key, table[key], "the entry point's fields belong in the [entry] table",
                 f"move {key} = ... under a line [entry] (one of command, module, file, "
                 "with args)")
        if key not in allowed:
            fail(f"{prefix}{key}", table[key], "unknown field",
                 f"use one of {', '.join(sorted(allowed))}")


def _int(fail, where: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        fail(where, value, "must be an integer", f"write {where} = 0")
    return value


def _entry(fail, entry, cwd: Path) -> tuple[str, ...]:
    if not isinstance(entry, dict):
        fail("entry", entry, "a job needs an entry point",
             'add [entry] with command = [...], module = "pkg.mod" or file = "job.py"')
    _unknown(fail, "entry.", entry, ENTRY)
    kinds = [k for k in ("command", "module", "file") if k in entry]
    if len(kinds) != 1:
        fail("entry", sorted(entry), "the entry point is exactly one of command, module, file",
             "keep one of them")
    args = entry.get("args", [])
    if not isinstance(args, list) or not all(isinstance(a, (str, int, float)) for a in args):
        fail("entry.args", args, "args is a list of strings", 'write args = ["--steps", "3"]')
    args = [str(a) for a in args]
    kind, target = kinds[0], entry[kinds[0]]
    if kind == "command":
        if isinstance(target, str):
            target = target.split()
        if not target or not all(isinstance(a, str) for a in target):
            fail("entry.command", target, "a command is a non-empty list of strings",
                 'write command = ["python", "train.py"]')
        return tuple(target) + tuple(args)
    if kind == "module":
        if not isinstance(target, str) or not re.fullmatch(r"[A-Za-z_][\w.]*", target):
            fail("entry.module", target, "not a Python module name", 'write module = "pkg.job"')
        return ("{python}", "-u", "-m", target, *args)
    if not isinstance(target, str) or not (cwd / target).is_file():
        fail("entry.file", target, "no such file", "name a Python file, relative to the job "
             "file's directory")
    return ("{python}", "-u", str((cwd / target).resolve()), *args)


def _models(fail, models):
    if not isinstance(models, dict) or not models:
        fail("models", models, "a job needs at least one model",
             'add [models.policy] with source = "tiny-qwen2"')
    out, devices, device_bytes = [], [], []
    for role, fields in models.items():
        where = f"models.{role}"
        if role not in ROLES:
            fail(where, role, "unknown role", f"use one of {', '.join(ROLES)}")
        if not isinstance(fields, dict):
            fail(where, fields, "a model is a table", f"write [{where}] then source = ...")
        _unknown(fail, f"{where}.", fields, set(MODEL) | {"resources"})
        if not isinstance(fields.get("source"), str) or not fields["source"]:
            fail(f"{where}.source", fields.get("source"), "a model needs a source",
                 'source = "tiny-qwen2" (built in) or a local checkpoint directory')
        spec = {}
        for key, kind in MODEL.items():
            if key in fields:
                value = fields[key]
                if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
                    fail(f"{where}.{key}", value, f"must be a {kind.__name__}",
                         f"write {key} = <{kind.__name__}>")
                if kind is int and value < 1:
                    fail(f"{where}.{key}", value, "must be at least 1", f"write {key} = 1")
                spec[key] = value
        if spec.get("head", "lm") not in ("lm", "value"):
            fail(f"{where}.head", spec["head"], "unknown head", 'use "lm" or "value"')
        if spec.get("optimizer", "adamw") not in ("adamw", "adamw-offload"):
            fail(f"{where}.optimizer", spec["optimizer"], "unknown optimizer",
                 'use "adamw" or "adamw-offload"')
        resources = fields.get("resources", {})
        if not isinstance(resources, dict):
            fail(f"{where}.resources", resources, "resources is a table",
                 f"write [{where}.resources] then devices = 1")
        _unknown(fail, f"{where}.resources.", resources, RESOURCES)
        if "devices" in resources:
            n = _int(fail, f"{where}.resources.devices", resources["devices"])
            unit = spec.get("tp", 1) * spec.get("pp", 1)
            if n < 1 or n % unit:
                fail(f"{where}.resources.devices", n, f"devices must be a positive multiple of "
                     f"tp * pp = {unit}", f"use {unit}, {2 * unit}, ...")
            devices.append((role, n))
        if "device_bytes" in resources:
            size = parse_bytes(resources["device_bytes"])
            if size is None or size < 1:
                fail(f"{where}.resources.device_bytes", resources["device_bytes"],
                     "not a size in bytes", 'write device_bytes = "64MiB" or a byte count')
            device_bytes.append((role, size))
        out.append((role, spec | {"source": fields["source"]}))
    return tuple(out), tuple(devices), tuple(device_bytes)


def _with_devices(spec: ModelSpec, devices: int) -> ModelSpec:
    from dataclasses import replace
    return replace(spec, dp=devices // (spec.tp * spec.pp))


def _bare(err: ConfigError) -> str:
    """The message of ``err`` without the where/value/fix ConfigError adds around it."""
    text = str(err)
    if err.field and text.startswith(f"{err.field}: "):
        text = text[len(err.field) + 2:]
    return text.split(" (got ")[0].split("; fix: ")[0]
