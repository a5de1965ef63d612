"""One exception tree for PlexRL; every error names what was wrong and how to fix it.

    PlexError                      base of everything PlexRL raises on purpose
    +-- ConfigError(ValueError)    a scenario, job spec or override is malformed
    +-- PlacementError(ValueError) a model fits no worker group (sizes in the message)
    +-- InvariantError(AssertionError)  a planner broke a numbered invariant (a bug)
    +-- AuthError(PermissionError) an unknown job, or a token that is not the job's
    +-- CallError(ValueError)      a malformed call (bad arguments, unknown role or loss)
    +-- OrderError(ValueError)     a call whose sequence number was already used
    +-- ServiceLost(RuntimeError)  the service actor (or a rank) hosting a job's state died
    +-- LeaseExpired(TimeoutError) a job's driver stopped renewing its lease; the job ended

Each error is picklable (errors cross process boundaries) and carries its context as
attributes, so a caller can report it without parsing the message. Expected "no"
answers of the scheduler (does not fit yet, wait) are values, not exceptions.
"""

from __future__ import annotations


class PlexError(Exception):
    """Base class of every error PlexRL raises on purpose."""

    def __reduce__(self):  # keep context attributes across pickling
        return (_rebuild, (type(self), self.args, self.__dict__))


def _rebuild(cls, args, state):
    err = cls.__new__(cls)
    Exception.__init__(err, *args)
    err.__dict__.update(state)
    return err


class ConfigError(PlexError, ValueError):
    """A configuration value is wrong: says the file, the field, the value and the fix."""

    def __init__(self, message: str, *, file: str = "", field: str = "", value: object = None,
                 fix: str = ""):
        parts = [p for p in (file, field) if p]
        where = ": ".join(parts)
        text = f"{where}: {message}" if where else message
        if value is not None:
            text += f" (got {value!r})"
        if fix:
            text += f"; fix: {fix}"
        super().__init__(text)
        self.file, self.field, self.value, self.fix = file, field, value, fix


class PlacementError(PlexError, ValueError):
    """A job's model fits no worker group; the message carries both sizes."""

    def __init__(self, message: str, *, job: str = "", need_bytes: int = 0,
                 largest_bytes: int = 0):
        super().__init__(message)
        self.job, self.need_bytes, self.largest_bytes = job, need_bytes, largest_bytes


class InvariantError(PlexError, AssertionError):
    """A numbered invariant (docs/design.md, 'Invariants') was broken: a planner bug."""

    def __init__(self, violations):
        self.violations = tuple(violations)
        super().__init__("; ".join(str(v) for v in self.violations))


class AuthError(PlexError, PermissionError):
    """A call named an unknown job, or carried a token that is not the job's."""

    def __init__(self, message: str, *, job: str = ""):
        super().__init__(message)
        self.job = job


class CallError(PlexError, ValueError):
    """A malformed call: says which call, what was wrong and how to fix it."""

    def __init__(self, message: str, *, job: str = "", seq: int = -1, function: str = ""):
        super().__init__(message)
        self.job, self.seq, self.function = job, seq, function


class OrderError(PlexError, ValueError):
    """A call reused a sequence number of its job, or arrived out of the order it claims."""

    def __init__(self, message: str, *, job: str = "", seq: int = -1):
        super().__init__(message)
        self.job, self.seq = job, seq


class ServiceLost(PlexError, RuntimeError):
    """The service actor of a worker group died, or one rank of a group of several devices;
    its jobs' calls cannot run. Carries the rank (-1: the group's service itself), the job's
    last durable version and its checkpoint file (-1 and "" when none was saved)."""

    def __init__(self, message: str, *, wg: str = "", job: str = "", last_version: int = -1,
                 checkpoint: str = "", rank: int = -1):
        super().__init__(message)
        self.wg, self.job, self.last_version, self.rank = wg, job, last_version, rank
        self.checkpoint = checkpoint   #: the file of ``last_version`` (SAVE or save_interval)


class LeaseExpired(PlexError, TimeoutError):
    """A job's driver sent no sign of life for its lease; the job was ended, its state freed."""

    def __init__(self, message: str, *, job: str = "", lease_s: float = 0.0):
        super().__init__(message)
        self.job, self.lease_s = job, lease_s
