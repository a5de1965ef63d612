"""Documentation rows of a config class: each leaf setting's dotted name, type, unit, default.

Owns: ``describe``. Must not know: what any setting means, or how files are read and
checked (``plexrl.config``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING

from plexrl.config import nested_class, type_hints, type_name


def describe(cls) -> list[tuple[str, str, str, object]]:
    """(dotted field, type, unit, default) per leaf setting; default ``MISSING`` = required.

    Nested dataclasses are expanded (``cluster.num_nodes``), tables of named dataclasses
    appear once with ``<name>`` (``models.<name>.tp``), each with the class defaults.
    """
    return list(_rows(cls, ""))


def _rows(cls, prefix: str):
    hints = type_hints(cls)
    for f in (f for f in dataclasses.fields(cls) if f.init):
        tp, dotted = hints[f.name], f"{prefix}{f.name}"
        nested = nested_class(tp)
        if nested is not None:
            inner, suffix = nested
            yield from _rows(inner, f"{dotted}{suffix}.")
            continue
        factory = f.default_factory if f.default_factory is not MISSING else None
        default = factory() if factory else f.default
        yield dotted, type_name(tp), f.metadata.get("unit", ""), default
