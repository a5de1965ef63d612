"""One exception tree for PlexRL; every error names what was wrong and how to fix it.

    PlexError                      base of everything PlexRL raises on purpose
    +-- ConfigError(ValueError)    a scenario, job spec or override is malformed
    +-- PlacementError(ValueError) a model fits no worker group (sizes in the message)
    +-- InvariantError(AssertionError)  a planner broke a numbered invariant (a bug)

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
