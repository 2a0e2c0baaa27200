"""The one way configuration is checked: a mapping (YAML, Hydra) becomes a typed dataclass.

Every config group (cluster, model, runner, search, executor) and the top-level keys are
frozen dataclasses; ``from_mapping`` builds one from the composed mapping when the config is
loaded, rejecting unknown keys (with the valid ones), missing keys and every value whose
type or range is wrong, each as one line that names the key as the user wrote it and what
is allowed (``search.early_stop='maybe': expected true or false``). All problems of a
mapping are reported together.

Why a small schema layer and not Hydra structured configs: OmegaConf's schemas know no
``Literal`` (only Enum), no ``str | list`` union (``search.retry``), no numeric ranges
(``cp`` in 1..1024), and their errors are multi-line; users' own cluster profiles would
also have to be registered in the ConfigStore. Hydra still composes; this layer checks.

What a field allows comes from its annotation (int, float, bool, str, Literal, Optional,
list[str], dict[str, scalar], tuple[int, ...] for "an int or a list of ints", str | list[str])
and its ``field(metadata=...)``: ``min``/``max`` (inclusive; ints default to >= 1, floats
to > 0 or ``gt``),
``choices`` (for str | list[str]), ``expect`` (a hand-written description) and ``doc``.
Defaults live in one place: the YAML of ``conf/`` for keys it lists (those fields have no
Python default), the dataclass for optional keys a YAML file may leave out.
"""
from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from hcp_tune.errors import ConfigError

T = TypeVar("T")
_NUMBERS = (int, float)


def as_int(value: Any, key: str, *, minimum: int = 1, maximum: int | None = None,
           strict: bool = False) -> int:
    """``value`` as an int in ``minimum..maximum``; digit strings pass unless ``strict``."""
    span = f"an integer in {minimum}..{maximum}" if maximum is not None else \
        f"an integer >= {minimum}"
    if isinstance(value, str) and not strict and value.strip().lstrip("-").isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}={value!r}: expected {span}")
    if value < minimum or (maximum is not None and value > maximum):
        raise ConfigError(f"{key}={value}: expected {span}")
    return value


def as_int_list(value: Any, key: str, *, minimum: int = 1, maximum: int | None = None,
                strict: bool = False) -> tuple[int, ...]:
    """An int or a non-empty list of ints (``seq=65536`` or ``seq=[32768,65536]``)."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise ConfigError(f"{key}=[]: expected an integer or a non-empty list of integers")
        out = []
        for item in value:
            try:
                out.append(as_int(item, key, minimum=minimum, maximum=maximum, strict=strict))
            except ConfigError as exc:
                expected = str(exc).split(": expected ", 1)[1]
                raise ConfigError(
                    f"{key}={list(value)}: element {item!r} is not {expected}") from None
        return tuple(dict.fromkeys(out))  # keep the user's order, drop repeats
    return (as_int(value, key, minimum=minimum, maximum=maximum, strict=strict),)


def as_bool(value: Any, key: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{key}={value!r}: expected true or false")
    return value


def _plain(value: Any) -> Any:
    """OmegaConf containers as plain lists and dicts (no import of omegaconf here)."""
    if type(value).__name__ == "ListConfig":
        return list(value)
    if type(value).__name__ == "DictConfig":
        return dict(value.items())
    return value


def _expected(tp: Any, meta: Mapping[str, Any]) -> str:
    if "expect" in meta:
        return meta["expect"]
    if tp is bool:
        return "true or false"
    if tp is int:
        lo, hi = meta.get("min", 1), meta.get("max")
        return f"an integer in {lo}..{hi}" if hi is not None else f"an integer >= {lo}"
    if tp is float:
        return f"a number >= {meta['min']}" if "min" in meta else f"a number > {meta.get('gt', 0)}"
    if tp is str:
        return "a non-empty string"
    if typing.get_origin(tp) is typing.Literal:
        return "one of " + ", ".join(map(str, typing.get_args(tp)))
    if typing.get_origin(tp) is list:
        return "a list of strings"
    if typing.get_origin(tp) is dict:
        return "a mapping of names to scalar values"
    return str(tp)


def _check_field(value: Any, tp: Any, key: str, meta: Mapping[str, Any]) -> Any:
    value = _plain(value)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union and type(None) in args:  # Optional[X]
        if value is None:
            return None
        rest = [a for a in args if a is not type(None)]
        tp = rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]
        try:
            return _check_field(value, tp, key, {**meta, "optional": True})
        except ConfigError:
            if typing.get_origin(tp) is tuple:  # its own line names the element and range
                raise
            raise ConfigError(f"{key}={value!r}: expected null or {_expected(tp, meta)}") from None
    words = [w for a in args if typing.get_origin(a) is typing.Literal
             for w in typing.get_args(a)]
    if origin is typing.Union and int in args and words:  # int | Literal["auto"]
        if value in words:
            return value
        try:
            return _check_field(value, int, key, meta)
        except ConfigError:
            raise ConfigError(f"{key}={value!r}: expected {' or '.join(map(str, words))}, "
                              f"or {_expected(int, meta)}") from None
    if origin is typing.Union:  # str | list[str], values from meta["choices"]
        items = value if isinstance(value, list) else [value]
        choices = meta.get("choices")
        if not items or not all(isinstance(x, str) and (not choices or x in choices) for x in items):
            allowed = ", ".join(choices) if choices else "strings"
            raise ConfigError(f"{key}={value!r}: expected one of {allowed}, or a list of them")
        return value
    if origin is tuple:  # tuple[int, ...]: an int or a list of ints
        return as_int_list(value, key, minimum=meta.get("min", 1), maximum=meta.get("max"),
                           strict=True)
    bad = ConfigError(f"{key}={value!r}: expected {_expected(tp, meta)}")
    if tp is int:
        if "expect" in meta:
            ok = isinstance(value, int) and not isinstance(value, bool) and \
                meta.get("min", 1) <= value <= meta.get("max", value)
            if not ok:
                raise bad
            return value
        return as_int(value, key, minimum=meta.get("min", 1), maximum=meta.get("max"),
                      strict=True)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, _NUMBERS):
            raise bad
        if not (value >= meta["min"] if "min" in meta else value > meta.get("gt", 0)):
            raise bad
        return float(value)
    if tp is bool:
        return as_bool(value, key)
    if tp is str:
        if not isinstance(value, str) or not value.strip():
            raise bad
        return value
    if origin is typing.Literal:
        if value not in args:
            raise bad
        return value
    if origin is list:
        if value is None and not meta.get("optional"):
            return []  # null in YAML means "none"
        if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
            raise bad
        return value
    if origin is dict:
        if value is None and not meta.get("optional"):
            return {}
        if not isinstance(value, dict) or not all(
                isinstance(k, str) and isinstance(v, (str, int, float, bool))
                for k, v in value.items()):
            raise bad
        return value
    return value


def valid_keys(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def from_mapping(cls: type[T], data: Any, where: str, source: str = "") -> T:
    """Instantiate dataclass ``cls`` from ``data``; ``where`` prefixes each key in errors
    (``search`` -> ``search.repeats``; ``""`` for the top level) and ``source`` (the file
    the mapping came from) ends each line. Every problem is reported."""
    try:
        return _build(cls, _plain(data), where)
    except ConfigError as exc:
        if not source:
            raise
        raise ConfigError("\n".join(f"{line} (in {source})"
                                     for line in str(exc).splitlines())) from None


def _build(cls: type[T], data: Any, where: str) -> T:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping of keys to values, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        key = f"{where}.{unknown[0]}" if where else unknown[0]
        raise ConfigError(f"{key}: unknown key; valid keys are: {', '.join(fields)}")
    kwargs, problems = {}, []
    for name, f in fields.items():
        key = f"{where}.{name}" if where else name
        if name not in data:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                problems.append(f"{key}: missing ({f.metadata.get('doc', 'required')})")
            continue
        try:
            kwargs[name] = _check_field(data[name], hints[name], key, f.metadata)
        except ConfigError as exc:
            problems.append(str(exc))
    if problems:
        raise ConfigError("\n".join(problems))
    return cls(**kwargs)
