"""Frozen dataclass configs with documented units, read from TOML/JSON files plus overrides.

Owns: ``option`` (a dataclass field carrying unit, doc, bounds and allowed values), reading
a config file, ``section.field=value`` overrides, and building a frozen dataclass from
nested dicts with errors a user can act on (file, dotted field, value, fix); documentation
rows of a config class are ``plexrl.config_docs``.

Must not know: what any setting means (core, sim and runtime own their config classes),
where files live, or how to convert units. A unit is a documented name only: "80GB" where
bytes are expected is an error, never 80e9, so one number has one reading everywhere.

Departures from a typical loader: no coercion (an int is accepted for a float, nothing
else: no "1" for 1, no 1 for true); unknown keys are errors; the first error stops a build.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import json
import math
import os
import re
import tomllib
import types
import typing
from dataclasses import MISSING
from pathlib import Path
from typing import Literal, Union, get_args, get_origin

from plexrl.errors import ConfigError

__all__ = ["MISSING", "option", "read_file", "parse_override", "apply_overrides",
           "build", "check_options", "load"]

type_hints = functools.cache(typing.get_type_hints)  # config classes live at module level


def option(default=MISSING, *, unit: str = "", doc: str = "", min: float | None = None,
           max: float | None = None, choices: tuple | None = None, default_factory=MISSING):
    """A dataclass field with its unit, meaning, bounds and allowed values.

    ``unit`` names what the raw number counts, one of "s", "bytes", "bytes/s", "FLOP/s",
    "frac" (a fraction in [0, 1]), "tokens", "count"; it is documentation, never converted.
    ``min``/``max`` are inclusive and apply to every number in the field (each element of
    an array); ``choices`` applies to every leaf value. No default means required.
    """
    meta = {"unit": unit, "doc": doc, "min": min, "max": max,
            "choices": None if choices is None else tuple(choices)}
    return dataclasses.field(default=default, default_factory=default_factory, metadata=meta)


# -- files ---------------------------------------------------------------------------------------
def read_file(path) -> dict:
    """The top-level table of a ``.toml`` or ``.json`` file; ConfigError says what to fix."""
    name = os.fspath(path)
    p = Path(name)
    if not p.exists():
        raise ConfigError("file not found", file=name,
                          fix=f"check the path (relative paths start at {os.getcwd()})")
    if p.is_dir():
        raise ConfigError("is a directory, not a config file", file=name,
                          fix="give the path of a .toml or .json file")
    suffix = p.suffix.lower()
    if suffix not in (".toml", ".json"):
        raise ConfigError("unknown config file type", file=name, value=p.suffix,
                          fix="use a .toml file (or .json)")
    try:
        text = p.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read: {e}", file=name,
                          fix="check that it is a readable UTF-8 text file") from None
    data = _parse(text, name, suffix)
    if not isinstance(data, dict):
        raise ConfigError("the top level must be a table of settings", file=name,
                          value=type(data).__name__, fix='write a JSON object: {"section": {...}}')
    return data


def _parse(text: str, name: str, suffix: str):
    """The parsed document; a syntax error names the line, shows it and says what to fix."""
    try:
        return tomllib.loads(text) if suffix == ".toml" else json.loads(text)
    except tomllib.TOMLDecodeError as e:
        where = re.search(r"line (\d+), column (\d+)", str(e))
        line, col = (int(where[1]), int(where[2])) if where else (0, 0)
        at = f"line {line}, column {col}" if where else "the end of the file"
        message, hint = f"not valid TOML: {e}", "strings need quotes, tables [headers]"
    except json.JSONDecodeError as e:
        line, at = e.lineno, f"line {e.lineno}, column {e.colno}"
        message, hint = f"not valid JSON: {e.msg} (at {at})", "keys need double quotes"
    lines = text.splitlines()
    shown = lines[line - 1].strip() if 0 < line <= len(lines) else None
    raise ConfigError(message, file=name, value=shown, fix=f"correct the syntax at {at} ({hint})")


# -- overrides -----------------------------------------------------------------------------------
def parse_override(text: str, *, file: str = "") -> tuple[str, object]:
    """``"section.field=value"`` -> (dotted key, value parsed as TOML, else a plain string).

    The fallback takes bare words (qwen-7b, 80GB) as strings; a value with brackets or
    quotes must be valid TOML. ``file`` only labels errors.
    """
    key, sep, raw = text.partition("=")
    key, raw = ".".join(part.strip() for part in key.split(".")), raw.strip()
    example = "write section.field=value, e.g. models.qwen7b.tp=2"
    if not sep:
        raise ConfigError("override has no '='", file=file, value=text, fix=example)
    if not key or "" in key.split("."):
        raise ConfigError("override has an empty key or key part", file=file, value=text,
                          fix=example)
    try:
        doc = tomllib.loads(f"v = {raw}")
    except tomllib.TOMLDecodeError as e:
        if raw and not re.search(r"[\[\]{}\"'\n]", raw):  # a bare word: a plain string
            return key, raw
        reason = re.sub(r" \(at .*\)$", "", str(e)) if raw else "no value"
        fix = "close quotes and brackets, e.g. " if raw else "give a value, e.g. "
        raise ConfigError(f"override value is not valid TOML: {reason}", file=file, field=key,
                          value=text, fix=f'{fix}{key}=[1, 2] or {key}="a b"') from None
    if set(doc) != {"v"}:
        raise ConfigError("override value must be one TOML value on one line", file=file,
                          field=key, value=text, fix=f"give one override per {key}=value")
    return key, doc["v"]


def apply_overrides(data: dict, overrides: list[str], *, file: str) -> dict:
    """A new nested dict with each ``section.field=value`` set; missing tables are created.

    A table value (``cluster={num_nodes=2}``) replaces the whole table. Keys are split on
    dots, so a name containing a dot can only be set in the file.
    """
    if isinstance(overrides, str):
        raise TypeError("overrides must be a list of 'section.field=value' strings")
    out = copy.deepcopy(data)
    for text in overrides:
        key, value = parse_override(text, file=file)
        parts = key.split(".")
        node = out
        for i, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                where = ".".join(parts[:i + 1])
                raise ConfigError(f"override {text!r} goes through {where}, a value, not a "
                                  "table", file=file, field=where, value=node,
                                  fix=f"set {where}=... itself, or drop the extra key parts")
        node[parts[-1]] = value
    return out


def _merge(base: dict, top: dict) -> dict:
    """``base`` with ``top`` laid over it, table by table; ``top`` wins on a clash."""
    out = copy.deepcopy(base)
    for key, value in top.items():
        both = isinstance(out.get(key), dict) and isinstance(value, dict)
        out[key] = _merge(out[key], value) if both else copy.deepcopy(value)
    return out


# -- build ---------------------------------------------------------------------------------------
class _Ctx(typing.NamedTuple):
    """Where a value sits: the file, its dotted field, and the field's option metadata."""

    file: str
    field: str
    meta: typing.Mapping

    def at(self, part: str, meta: typing.Mapping | None = None) -> _Ctx:
        field = f"{self.field}.{part}" if self.field else part
        return _Ctx(self.file, field, self.meta if meta is None else meta)

    def fail(self, message: str, value: object = None, fix: str = "") -> ConfigError:
        return ConfigError(message, file=self.file, field=self.field, value=value, fix=fix)

    @property
    def unit(self) -> str:
        return self.meta.get("unit", "")


def build(cls, data: dict, *, file: str = "", prefix: str = ""):
    """An instance of dataclass ``cls`` from nested dicts; errors name ``prefix.field``."""
    ctx = _Ctx(file, prefix, {})
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    if not isinstance(data, dict):
        raise ctx.fail(f"expected a table of {cls.__name__} settings", data,
                       fix=f"write a [{prefix or cls.__name__}] table with keys "
                           f"{', '.join(fields)}")
    _reject_unknown(data, fields, ctx)
    hints = type_hints(cls)
    kwargs = {}
    for name, f in fields.items():
        sub = ctx.at(name, f.metadata)
        if name in data:
            kwargs[name] = _convert(hints[name], data[name], sub)
        elif f.default is MISSING and f.default_factory is MISSING:
            raise _missing(hints[name], sub)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except ValueError as e:  # a __post_init__ check across fields
        raise ctx.fail(f"{cls.__name__}: {e}", fix="change the values named above") from e


def _reject_unknown(data: dict, fields: dict, ctx: _Ctx) -> None:
    unknown = [key for key in data if key not in fields]
    if not unknown:
        return
    key, valid = str(unknown[0]), list(fields)
    close = difflib.get_close_matches(key, valid, n=1)
    fix = f"did you mean {close[0]!r}? " if close else "remove or rename it; "
    fix += (f"valid keys: {', '.join(valid)}" if len(valid) <= 12
            else f"{len(valid)} valid keys, listed by plexrl.config_docs.describe")
    more = f" (also unknown: {', '.join(map(str, unknown[1:]))})" if unknown[1:] else ""
    raise ctx.at(key).fail(f"unknown key{more}", data[unknown[0]], fix=fix)


def _missing(tp, ctx: _Ctx) -> ConfigError:
    section, _, name = ctx.field.rpartition(".")
    doc = ctx.meta.get("doc")
    message = f"missing required field ({doc})" if doc else "missing required field"
    if nested_class(tp) is not None:
        return ctx.fail(message, fix=f"add a [{ctx.field}] table")
    where = f"under [{section}]" if section else "at the top level"
    unit = f", {ctx.unit}" if ctx.unit else ""
    return ctx.fail(message, fix=f"add {name} = <{type_name(tp)}{unit}> {where}")


def _convert(tp, value, ctx: _Ctx):
    """``value`` checked against ``tp``; arrays become tuples for tuple fields, ints floats."""
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) != 1:
            raise TypeError(f"{ctx.field}: only 'T | None' unions are supported, got {tp}")
        return None if value is None else _convert(options[0], value, ctx)
    if origin is Literal:
        if not any(type(a) is type(value) and a == value for a in args):
            raise ctx.fail(f"expected one of {', '.join(map(repr, args))}", value,
                           fix=_choose(value, args))
        return _check_leaf(value, ctx)
    if tp in (tuple, list) or origin in (tuple, list):
        return _convert_array(origin or tp, args, value, ctx)
    if tp is dict or origin is dict:
        return _convert_table(args, value, ctx)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return build(tp, value, file=ctx.file, prefix=ctx.field)
    if tp in _SCALARS:
        return _convert_scalar(tp, value, ctx)
    raise TypeError(f"config.build cannot read {ctx.field} of type {tp!r}")


def _convert_array(kind, args, value, ctx: _Ctx):
    if not isinstance(value, (list, tuple)):
        raise _wrong_type("an array", value, ctx)
    if kind is tuple and args and args[-1] is not Ellipsis:
        raise TypeError(f"{ctx.field}: use tuple[T, ...], not a fixed-length tuple")
    item_type, at = args[0] if args else object, ctx.field
    items = [_convert(item_type, v, ctx._replace(field=f"{at}[{i}]")) for i, v in enumerate(value)]
    return tuple(items) if kind is tuple else items


def _convert_table(args, value, ctx: _Ctx):
    if not isinstance(value, dict):
        raise _wrong_type("a table of named entries", value, ctx,
                          fix=f"write one [{ctx.field}.<name>] table per entry")
    value_type = args[1] if args else object
    return {name: _convert(value_type, sub, ctx.at(str(name))) for name, sub in value.items()}


_SCALARS = {  # type: (accepts, in words)
    int: (lambda v: isinstance(v, int) and not isinstance(v, bool), "an integer"),
    float: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    bool: (lambda v: isinstance(v, bool), "true or false"),
    str: (lambda v: isinstance(v, str), "a string"),
    object: (lambda v: True, "any value"),
}


def _convert_scalar(tp, value, ctx: _Ctx):
    accepts, words = _SCALARS[tp]
    if not accepts(value):
        raise _wrong_type(words, value, ctx)
    if tp is float:
        if not math.isfinite(value):
            raise ctx.fail("not a finite number", value, fix=_plain_number(ctx))
        value = float(value)
    return _check_leaf(value, ctx)


def _check_leaf(value, ctx: _Ctx):
    lo, hi, choices = (ctx.meta.get(k) for k in ("min", "max", "choices"))
    unit = f" {ctx.unit}" if ctx.unit else ""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if number and lo is not None and value < lo:
        raise ctx.fail(f"below the minimum {lo}{unit}", value, fix=f"use a value >= {lo}{unit}")
    if number and hi is not None and value > hi:
        raise ctx.fail(f"above the maximum {hi}{unit}", value, fix=f"use a value <= {hi}{unit}")
    if choices is not None and value not in choices:
        raise ctx.fail("not an allowed value", value, fix=_choose(value, choices))
    return value


def check_options(obj) -> None:
    """Check the scalar fields of a dataclass made in code against their options' bounds and
    allowed values, as ``build`` checks what a file says (``ConfigError`` naming the field)."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.metadata and isinstance(value, (str, int, float)):
            _check_leaf(value, _Ctx("", f.name, f.metadata))


def _wrong_type(words: str, value, ctx: _Ctx, fix: str = "") -> ConfigError:
    """'expected an integer (count)', with a fix for the usual slips."""
    unit = f" ({ctx.unit})" if ctx.unit else ""
    number = words in ("an integer", "a number")
    if value is None:
        fix = f"give {words}, or remove the key if the field has a default"
    elif number and isinstance(value, str):
        quoted = re.fullmatch(r"\s*[-+]?(\d[\d_]*\.?\d*([eE][-+]?\d+)?|inf)\s*", value)
        fix = ("remove the quotes; " if quoted else "") + _plain_number(ctx)
    elif number and isinstance(value, bool):
        fix = "write a number, not true or false"
    elif words == "an integer" and isinstance(value, float) and value.is_integer():
        fix = f"write {int(value)} without a decimal point"
    elif words == "true or false":
        fix = "write true or false (lowercase, no quotes)"
    elif words == "a string" and not isinstance(value, (dict, list)):
        fix = f'put it in quotes: "{value}"'
    elif words == "an array":
        fix = "write an array in brackets, e.g. [1, 2]"
    got = ", got null" if value is None else ""
    return ctx.fail(f"expected {words}{unit}{got}", value, fix=fix or f"give {words}")


def _plain_number(ctx: _Ctx) -> str:
    unit = f" in {ctx.unit}" if ctx.unit else ""
    return f"give a plain number{unit} (unit suffixes such as '80GB' are not read)"


def _choose(value, allowed) -> str:
    words = [str(a) for a in allowed]
    close = difflib.get_close_matches(value, words, n=1) if isinstance(value, str) else []
    hint = f"did you mean {close[0]!r}? " if close else ""
    return f"{hint}use one of: {', '.join(map(repr, allowed))}"


def nested_class(tp) -> tuple[type, str] | None:
    """(dataclass, key suffix) when ``tp`` is a dataclass, ``DC | None`` or ``dict[str, DC]``."""
    origin, args = get_origin(tp), get_args(tp)
    if origin in (Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        return nested_class(options[0]) if len(options) == 1 else None
    if origin is dict and len(args) == 2 and dataclasses.is_dataclass(args[1]):
        return args[1], ".<name>"
    return (tp, "") if isinstance(tp, type) and dataclasses.is_dataclass(tp) else None


def type_name(tp) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if tp is type(None) or tp is Ellipsis:
        return "None" if tp is type(None) else "..."
    if origin in (Union, types.UnionType):
        return " | ".join(type_name(a) for a in args)
    if origin is Literal:
        return f"Literal[{', '.join(map(repr, args))}]"
    if origin is not None:
        return f"{type_name(origin)}[{', '.join(type_name(a) for a in args)}]"
    return getattr(tp, "__name__", repr(tp).removeprefix("typing."))


# -- load ----------------------------------------------------------------------------------------
def load(cls, path, overrides=(), *, defaults: dict | None = None):
    """``cls`` from a file, laid over ``defaults``, then ``overrides``; errors name ``path``."""
    file = os.fspath(path)
    data = read_file(file)
    if defaults:
        data = _merge(defaults, data)
    return build(cls, apply_overrides(data, overrides, file=file), file=file)
