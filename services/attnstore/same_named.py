"""Builds a typed value from another one whose fields have the same names: a mapper at an
edge (proto to dataclass, dataclass to proto, settings to a component's limits) names only
the fields that change on the way. A hand-written keyword list per edge let a field added to
both sides be left out of the copy and silently take its default; here it cannot."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from google.protobuf.message import Message
from pydantic import BaseModel

T = TypeVar("T")


def field_names(target: type) -> tuple[str, ...]:
    """The fields a dataclass, pydantic model or protobuf message is built from."""
    if dataclasses.is_dataclass(target):
        return tuple(f.name for f in dataclasses.fields(target) if f.init)
    if issubclass(target, BaseModel):
        return tuple(target.model_fields)
    if issubclass(target, Message):
        return tuple(f.name for f in target.DESCRIPTOR.fields)
    raise TypeError(f"{target.__name__} is not a dataclass, pydantic model or protobuf message")


def same_named(target: type[T], source: object, /, **changed: Any) -> T:
    """`target` with every field read from `source`'s attribute of the same name, except
    those given in `changed`. A field `source` lacks is an AttributeError naming it."""
    values = {name: getattr(source, name) for name in field_names(target) if name not in changed}
    return target(**values, **changed)
