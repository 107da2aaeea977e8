"""Hypothesis strategies for any protobuf message, built by walking its descriptor: every
field set or left unset, each with values picked to break validation code. Integers at
their type's extremes, NaN and infinities, empty, odd, huge and unicode-edge strings (NUL,
bidi overrides, combining marks, non-characters; never surrogates, which proto strings
cannot carry), byte strings around the sizes the services check (16-byte namespaces,
32-byte keys) and far beyond, enum numbers no enum names, repeated fields with thousands of
elements, nested messages.

`pools` name values known to the server by field name (a registered namespace, stored
keys, live session ids), mixed in so that some calls get past the first checks and reach
the state behind them."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor, MethodDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

MAX_DEPTH = 3
HUGE_REPEATED = (4_000, 6_000)  # over every per-call limit of the services
UNICODE_EDGES = (
    "",
    " ",
    "\x00",
    "a\x00b",
    "\u202eevil\u202c",  # right-to-left override
    "\u200f\u05e9\u05dc\u05d5\u05dd",  # RTL mark, Hebrew
    "e\u0301" * 50,  # combining marks
    "\ufeff",  # byte order mark
    "\uffff\ufffe",  # non-characters
    "\U0010ffff",
    "\U0001f600" * 10,
    "\t\r\n",
    "../../etc/passwd",
    "%s%n{}{{",
)
_INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}


def request_class(method: MethodDescriptor) -> type[Message]:
    return GetMessageClass(method.input_type)


def response_class(method: MethodDescriptor) -> type[Message]:
    return GetMessageClass(method.output_type)


def _integers(low: int, high: int) -> st.SearchStrategy[int]:
    edges = [v for v in (low, -1, 0, 1, 2, 255, 256, 4096, 65536, high // 2, high) if low <= v <= high]
    return st.one_of(st.sampled_from(edges), st.integers(0, 300), st.integers(low, high))


def _texts() -> st.SearchStrategy[str]:
    odd = st.characters(exclude_categories=("Cs",))  # any code point but surrogates
    return st.one_of(
        st.sampled_from(UNICODE_EDGES),
        st.text(odd, max_size=40),
        st.text(st.characters(codec="ascii"), max_size=12),
        st.integers(1_000, 300_000).map(lambda n: "x" * n),  # around and past the length limits
    )


def _bytes() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.sampled_from([b"", b"\x00"]),
        st.sampled_from([15, 16, 17, 31, 32, 33]).flatmap(lambda n: st.binary(min_size=n, max_size=n)),
        st.binary(max_size=64),
        st.integers(1 << 20, 3 << 20).map(bytes),  # megabytes of zeros
    )


def _floats(width: int) -> st.SearchStrategy[float]:
    return st.one_of(
        st.sampled_from([0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 1e-45, 1e38, math.nan, math.inf, -math.inf]),
        st.floats(width=width),  # NaN and infinities included
    )


class ProtoStrategies:
    def __init__(self, pools: Mapping[str, Sequence[Any]] | None = None) -> None:
        self._pools = dict(pools or {})

    def message(self, descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Message]:
        cls = GetMessageClass(descriptor)
        if depth >= MAX_DEPTH:
            return st.just(cls())
        fields = {field.name: self._field(field, depth) for field in descriptor.fields}
        return st.fixed_dictionaries({}, optional=fields).map(lambda values: _build(cls, values))

    def mutated(self, base: Message, depth: int = 0) -> st.SearchStrategy[Message]:
        """`base` (a valid request) with some fields replaced by fuzzed values (set
        sub-messages are mutated the same way, or replaced): the rest stays valid, so the
        fuzzed fields reach the checks behind the first ones."""
        fields = {}
        for field in base.DESCRIPTOR.fields:
            fields[field.name] = self._field(field, depth)
            if (
                field.type == FieldDescriptor.TYPE_MESSAGE
                and not field.is_repeated
                and base.HasField(field.name)
            ):
                fields[field.name] = st.one_of(
                    self.mutated(getattr(base, field.name), depth + 1), fields[field.name]
                )
        return st.fixed_dictionaries({}, optional=fields).map(
            lambda changes: _build(type(base), changes, base)
        )

    def _field(self, field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
        single = self._single(field, depth)
        # Pools hold scalar values (chunk keys, ids): a message field of the same name
        # (MicroAttention's `keys` tensor) takes none of them.
        pool = self._pools.get(field.name) if field.type != FieldDescriptor.TYPE_MESSAGE else None
        if pool:
            single = st.one_of(st.sampled_from(pool), single)
        if not field.is_repeated:
            return single
        small = st.lists(single, max_size=5)
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            return small
        # Thousands of copies of one short value: many elements, not many bytes.
        short = {
            FieldDescriptor.TYPE_STRING: st.text(max_size=8),
            FieldDescriptor.TYPE_BYTES: st.binary(max_size=33),
        }
        element = short.get(field.type, single)
        if pool:
            element = st.one_of(st.sampled_from(pool), element)
        return st.one_of(
            small, st.tuples(element, st.integers(*HUGE_REPEATED)).map(lambda vn: [vn[0]] * vn[1])
        )

    def _single(self, field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any]:
        kind = field.type
        if kind in _INT_RANGES:
            return _integers(*_INT_RANGES[kind])
        if kind == FieldDescriptor.TYPE_BOOL:
            return st.booleans()
        if kind in (FieldDescriptor.TYPE_FLOAT, FieldDescriptor.TYPE_DOUBLE):
            return _floats(32 if kind == FieldDescriptor.TYPE_FLOAT else 64)
        if kind == FieldDescriptor.TYPE_STRING:
            return _texts()
        if kind == FieldDescriptor.TYPE_BYTES:
            return _bytes()
        if kind == FieldDescriptor.TYPE_ENUM:
            known = [value.number for value in field.enum_type.values]
            return st.one_of(st.sampled_from(known), _integers(-(2**31), 2**31 - 1))
        return self.message(field.message_type, depth + 1)


def _build(cls: type[Message], values: Mapping[str, Any], base: Message | None = None) -> Message:
    message = cls()
    if base is not None:
        message.CopyFrom(base)
    for name, value in values.items():
        field = cls.DESCRIPTOR.fields_by_name[name]
        message.ClearField(name)
        if field.is_repeated:
            getattr(message, name).extend(value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            getattr(message, name).CopyFrom(value)
        else:
            setattr(message, name, value)
    return message


def wire_garbage(descriptor: Descriptor) -> st.SearchStrategy[bytes]:
    """Bytes that are not a valid encoding of the message, or encode its fields with the
    wrong wire types: random bytes, and records with the message's own field numbers (and
    0 or the largest) under any of the 8 wire types, declared lengths that lie, and
    truncated varints."""
    numbers = [field.number for field in descriptor.fields] + [0, 2**29 - 1]
    record = st.builds(
        _record, st.sampled_from(numbers), st.integers(0, 7), st.binary(max_size=12), st.integers(-3, 3)
    )
    return st.one_of(
        st.binary(min_size=1, max_size=64), st.lists(record, min_size=1, max_size=6).map(b"".join)
    )


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _record(number: int, wire_type: int, payload: bytes, length_error: int) -> bytes:
    key = _varint((number << 3) | wire_type)
    if wire_type == 0:
        return key + (payload[:10] if payload else b"\x80")  # a varint, maybe cut short
    if wire_type == 2:
        return key + _varint(max(0, len(payload) + length_error)) + payload
    width = {1: 8, 5: 4}.get(wire_type)
    return key + (payload[:width].ljust(width, b"\0") if width else payload)  # groups and reserved types
