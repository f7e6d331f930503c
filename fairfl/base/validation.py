"""Typed, validated dataclass fields, one way for every settings object of the package (the
algorithms' options, ExperimentConfig, LocalTraining, PartitionSpec, the attacks).

A field declared with :func:`option` carries its constraints; :func:`validate_options` checks
every field at construction against its annotation (``int``, ``float``, ``bool``, ``str``,
``tuple[int, ...]``, each optionally ``| None``) and those constraints, and raises one
ConfigError naming the owner, the field, the value and what is allowed. Numbers are
canonicalised (an int given for a float becomes a float, a list for a tuple becomes a tuple), so
that equal settings serialise, and hash, alike.
"""
from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import field
from typing import Any, Mapping, Sequence

import numpy as np

from .errors import ConfigError


def did_you_mean(unknown: Sequence[Any], known: Sequence[str]) -> str:
    """"; did you mean 'rounds'?" for names that are close to a known one (a typo of a key or an
    option), else ""."""
    import difflib
    pairs = []
    for name in unknown:
        close = difflib.get_close_matches(str(name), list(known), n=1, cutoff=0.6)
        if close:
            pairs.append(f"{close[0]!r}" + (f" for {name!r}" if len(unknown) > 1 else ""))
    return f"; did you mean {', '.join(pairs)}?" if pairs else ""


def option(default: Any = dataclasses.MISSING, *, low: float | None = None, high: float | None = None,
           low_open: bool = False, high_open: bool = False, choices: Sequence[Any] | None = None,
           doc: str = "", default_factory: Any = dataclasses.MISSING) -> Any:
    """A validated field: a number in [low, high] (open ends with ``*_open``), or one of
    ``choices``. Its annotation gives the type."""
    meta = {"low": low, "high": high, "low_open": low_open, "high_open": high_open,
            "choices": tuple(choices) if choices is not None else None, "doc": doc}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


_KINDS = {"int": int, "float": float, "bool": bool, "str": str}
_TUPLE_OF_INTS = "tuple_of_ints"


def _annotation(tp: Any) -> tuple[Any, bool]:
    """(int / float / bool / str / "tuple_of_ints" or None, whether None is allowed) of a field's
    annotation, written as a string (``from __future__ import annotations``) or as a type."""
    if isinstance(tp, str):
        parts = [part.strip() for part in tp.split("|")]
        optional = "None" in parts
        rest = [part for part in parts if part != "None"]
        if len(rest) != 1:
            return None, optional
        if rest[0].replace(" ", "") == "tuple[int,...]":
            return _TUPLE_OF_INTS, optional
        return _KINDS.get(rest[0]), optional
    args = typing.get_args(tp)
    if args and (typing.get_origin(tp) is typing.Union or isinstance(tp, types.UnionType)):
        rest = [a for a in args if a is not type(None)]
        kind, _ = _annotation(rest[0]) if len(rest) == 1 else (None, False)
        return kind, len(rest) < len(args)
    if typing.get_origin(tp) is tuple and typing.get_args(tp) == (int, Ellipsis):
        return _TUPLE_OF_INTS, False
    return (tp if tp in _KINDS.values() else None), False


def _describe(meta: Mapping[str, Any], kind: Any) -> str:
    if kind == _TUPLE_OF_INTS:
        what = "a tuple of integers"
    else:
        what = {int: "an integer", float: "a finite number", bool: "True or False", str: "a string"}[kind]
    if meta.get("choices"):
        return "one of " + ", ".join(repr(c) for c in meta["choices"])
    lo, hi = meta.get("low"), meta.get("high")
    if lo is None and hi is None:
        return what
    left = "(" if meta.get("low_open") or lo is None else "["
    right = ")" if meta.get("high_open") or hi is None else "]"
    low = "-inf" if lo is None else f"{lo:g}"
    high = "inf" if hi is None else f"{hi:g}"
    return f"{what}{' each' if kind == _TUPLE_OF_INTS else ''} in {left}{low}, {high}{right}"


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _in_range(value: float, meta: Mapping[str, Any]) -> bool:
    lo, hi = meta.get("low"), meta.get("high")
    if lo is not None and (value < lo or (meta.get("low_open") and value == lo)):
        return False
    if hi is not None and (value > hi or (meta.get("high_open") and value == hi)):
        return False
    return True


def validate_options(obj: Any, owner: str | None = None) -> None:
    """Check (and canonicalise) every typed field of the dataclass ``obj``; raise one ConfigError
    naming ``owner``, the field, its value and what is allowed."""
    owner = owner or type(obj).__name__
    for f in dataclasses.fields(obj):
        if not f.init:
            continue
        value = getattr(obj, f.name)
        kind, optional = _annotation(f.type)
        if kind is None or (value is None and optional):
            continue
        meta = f.metadata or {}

        def bad() -> ConfigError:
            return ConfigError(f"{owner}: {f.name}={value!r} is not allowed; it must be {_describe(meta, kind)}"
                               + (" or None" if optional else ""))
        if kind == _TUPLE_OF_INTS:
            if isinstance(value, (str, bytes)) or not isinstance(value, (tuple, list, np.ndarray)):
                raise bad()
            if not all(_is_int(v) and _in_range(int(v), meta) for v in value):
                raise bad()
            object.__setattr__(obj, f.name, tuple(int(v) for v in value))
            continue
        if kind is bool:
            if not isinstance(value, (bool, np.bool_)):
                raise bad()
            value = bool(value)
        elif kind is int:
            if not _is_int(value):
                raise bad()
            value = int(value)
        elif kind is float:
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise bad()
            value = float(value)
            if not math.isfinite(value):
                raise bad()
        elif kind is str and not isinstance(value, str):
            raise bad()
        if meta.get("choices") is not None and value not in meta["choices"]:
            raise bad()
        if kind in (int, float) and not _in_range(value, meta):
            raise bad()
        object.__setattr__(obj, f.name, value)


def _literal_choices(tp: Any) -> tuple | None:
    if typing.get_origin(tp) is typing.Literal:
        return typing.get_args(tp)
    return None


def call_options(fn: Any, options: Mapping[str, Any], owner: str, skip: Sequence[str] = ()) -> dict[str, Any]:
    """The keyword options given for ``fn``, checked and in canonical form: unknown names are a
    ConfigError listing the known ones; values are checked against the parameters' annotations
    (int, float, bool, str, tuple[int, ...], Literal[...], each optionally | None) and converted to
    their type; an option equal to ``fn``'s default is left out, so that leaving an option out and
    passing its default value give one setting."""
    import inspect
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise ConfigError(f"{owner} must be a mapping of option names to values, got {options!r}")
    signature = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    params = {name: p for name, p in signature.parameters.items()
              if name not in skip and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    unknown = sorted(set(options) - set(params))
    if unknown:
        raise ConfigError(f"{owner}: unknown option(s) {', '.join(unknown)}{did_you_mean(unknown, list(params))}; "
                          f"the options are: {', '.join(params) or 'none'}")
    out = {}
    for name, p in params.items():
        if name not in options and p.default is inspect.Parameter.empty:
            raise ConfigError(f"{owner}: option {name} is required")
        value = options.get(name, p.default)
        tp = hints.get(name)
        optional = False
        if tp is not None and (typing.get_origin(tp) is typing.Union or isinstance(tp, types.UnionType)):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            optional = len(args) < len(typing.get_args(tp))
            tp = args[0] if len(args) == 1 else None
        if tp is not None and not (value is None and optional):
            choices = _literal_choices(tp)
            if choices is not None:
                if value not in choices:
                    raise ConfigError(f"{owner}: {name}={value!r} is not allowed; it must be one of "
                                      + ", ".join(repr(c) for c in choices))
            else:
                probe = dataclasses.make_dataclass("Probe", [(name, tp, field(default=None))], frozen=True)
                checked = probe(**{name: value})
                validate_options(checked, owner)
                value = getattr(checked, name)
        if name in options and value != p.default:
            out[name] = value
    return out
