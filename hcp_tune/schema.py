"""Build frozen dataclasses from user mappings (YAML, Hydra) with one-line errors.

The one place that turns an untyped mapping into a typed record: it rejects unknown keys
(listing the valid ones), missing keys, wrong types and non-positive numbers, naming the
file or group the mapping came from so the user knows which file to fix.
"""
from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from hcp_tune.errors import ConfigError

T = TypeVar("T")


def as_int(value: Any, key: str, *, minimum: int = 1) -> int:
    """``value`` as an int >= ``minimum``; ``key`` is named as the user wrote it."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        else:
            raise ConfigError(f"{key}={value!r}: expected an integer >= {minimum}")
    if value < minimum:
        raise ConfigError(f"{key}={value}: expected an integer >= {minimum}")
    return value


def as_int_list(value: Any, key: str, *, minimum: int = 1) -> tuple[int, ...]:
    """An int or a non-empty list of ints (``seq=65536`` or ``seq=[32768,65536]``)."""
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        items = list(value)
        if not items:
            raise ConfigError(f"{key}=[]: expected an integer or a non-empty list of integers")
        out = []
        for item in items:
            try:
                out.append(as_int(item, key, minimum=minimum))
            except ConfigError:
                raise ConfigError(
                    f"{key}={items}: element {item!r} is not an integer >= {minimum}"
                ) from None
        return tuple(dict.fromkeys(out))  # keep the user's order, drop repeats
    return (as_int(value, key, minimum=minimum),)


def _check_field(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union:  # Optional[X]
        if value is None and type(None) in args:
            return None
        tp = next(a for a in args if a is not type(None))
    if tp is int:
        return as_int(value, key)
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"{key}={value!r}: expected a positive number")
        return float(value)
    if tp is str:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{key}={value!r}: expected a non-empty string")
        return value
    if typing.get_origin(tp) is typing.Literal:
        if value not in typing.get_args(tp):
            choices = ", ".join(map(str, typing.get_args(tp)))
            raise ConfigError(f"{key}={value!r}: expected one of {choices}")
        return value
    return value


def from_mapping(cls: type[T], data: Any, where: str) -> T:
    """Instantiate dataclass ``cls`` from ``data``; ``where`` names the source in errors."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a mapping of keys to values, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(
            f"{where}: unknown key {unknown[0]!r}; valid keys are {', '.join(fields)}"
        )
    kwargs = {}
    for name, f in fields.items():
        if name not in data:
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            if required:
                raise ConfigError(f"{where}: missing key {name!r} ({_doc(cls, name)})")
            continue
        kwargs[name] = _check_field(data[name], hints[name], f"{where}.{name}")
    return cls(**kwargs)


def _doc(cls: type, name: str) -> str:
    meta = {f.name: f.metadata for f in dataclasses.fields(cls)}[name]
    return meta.get("doc", "required")
