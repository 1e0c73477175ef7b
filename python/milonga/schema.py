"""Schemas from dataclasses (docs/schemas.md).

A publisher declared with ``PublisherQos(schema=Track)`` sends each value by
position, without field names; the schema travels once. :func:`schema_of`
builds the schema of a dataclass (or a ``TypedDict``) in the form the Rust
``Schema::from_value`` reads; :func:`as_dataclass` turns a received value
map back into the dataclass.

Types map as follows: ``bool``; ``int`` is i64; ``float`` f64; ``str``;
``bytes``; ``list[float]`` and ``list[int]`` are numeric arrays (received
as numpy arrays); other ``list[T]`` lists; ``T | None`` optional; an
``enum.Enum`` subclass an enum of its member names; a nested dataclass a
struct; ``dict``, ``Any`` and anything else ``any`` (plain CBOR). A field's
default (not a ``default_factory``) is the reader's default; other names a
field was known by go in ``field(metadata={"aliases": [...]})``.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from typing import Any

__all__ = ["schema_of", "as_dataclass"]


def schema_of(cls: type) -> dict[str, Any]:
    """The schema of dataclass (or TypedDict) ``cls``, as a dict."""
    return {"name": cls.__name__, "fields": _fields(cls, 0)}


def _fields(cls: type, depth: int) -> list[dict[str, Any]]:
    if depth > 16:
        raise ValueError(f"{cls.__name__}: types nested deeper than 16 (a recursive type?)")
    hints = typing.get_type_hints(cls)
    out: list[dict[str, Any]] = []
    if dataclasses.is_dataclass(cls):
        for f in dataclasses.fields(cls):
            d: dict[str, Any] = {"name": f.name, "type": _type(hints[f.name], depth)}
            aliases = f.metadata.get("aliases")
            if aliases:
                d["aliases"] = list(aliases)
            if f.default is not dataclasses.MISSING:
                d["default"] = f.default.name if isinstance(f.default, enum.Enum) else f.default
            out.append(d)
    elif typing.is_typeddict(cls):
        for name, hint in hints.items():
            out.append({"name": name, "type": _type(hint, depth)})
    else:
        raise TypeError(f"{cls!r} is neither a dataclass nor a TypedDict")
    return out


_SCALARS: dict[Any, str] = {bool: "bool", int: "i64", float: "f64", str: "text", bytes: "bytes"}


def _type(hint: Any, depth: int) -> Any:
    if hint in _SCALARS:
        return _SCALARS[hint]
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        if len(rest) == 1 and len(args) == 2:
            return {"optional": _type(rest[0], depth + 1)}
        return "any"
    if origin is list and len(args) == 1:
        if args[0] is float:
            return {"array": "f64"}
        if args[0] is int:
            return {"array": "i64"}
        return {"list": _type(args[0], depth + 1)}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return {"enum": [m.name for m in hint]}
    if isinstance(hint, type) and (dataclasses.is_dataclass(hint) or typing.is_typeddict(hint)):
        return {"struct": _fields(hint, depth + 1)}
    return "any"


def as_dataclass(cls: type, value: Any) -> Any:
    """Builds a ``cls`` from a received value map: nested dataclasses,
    enum members from their names, numeric arrays as lists. Fields the map
    lacks take the dataclass's defaults; keys the dataclass lacks are
    ignored (a writer's newer fields)."""
    return _build(cls, value)


def _build(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        return _build(rest[0], value) if len(rest) == 1 else value
    if origin is list and len(args) == 1:
        items = value.tolist() if hasattr(value, "tolist") else list(value)
        return [_build(args[0], x) for x in items]
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint[value] if isinstance(value, str) else hint(value)
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        hints = typing.get_type_hints(hint)
        kwargs = {
            f.name: _build(hints[f.name], value[f.name])
            for f in dataclasses.fields(hint)
            if f.init and f.name in value
        }
        return hint(**kwargs)
    return value
