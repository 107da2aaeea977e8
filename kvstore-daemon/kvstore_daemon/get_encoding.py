"""GetResponse messages written straight from arena views.

Building a GetResponse through the protobuf API copies each layer three times (a join,
the field assignment, serialization), into freshly allocated memory each time. Writing
the protobuf wire format from the views copies once. The shared interceptor sends
`bytes` replies as they are (attnstore.server.interceptors), and clients parse them with
the generated GetResponse like any other reply.
"""

from __future__ import annotations

from collections.abc import Sequence

from attnstore.kvstore.v1 import kvstore_pb2 as pb

_LENGTH_DELIMITED, _VARINT = 2, 0


def _tag(message: type[pb.GetResponse | pb.LayerSlice], field: str, wire_type: int) -> bytes:
    return _varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | wire_type)


def _varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


_HEADER_TAG = _tag(pb.GetResponse, "chunk_headers", _LENGTH_DELIMITED)
_SLICE_TAG = _tag(pb.GetResponse, "slices", _LENGTH_DELIMITED)
_CHUNK_INDEX_TAG = _tag(pb.LayerSlice, "chunk_index", _VARINT)
_LAYER_TAG = _tag(pb.LayerSlice, "layer", _VARINT)
_DATA_TAG = _tag(pb.LayerSlice, "data", _LENGTH_DELIMITED)


class GetResponseWriter:
    """Accumulates one GetResponse; `take()` returns its serialized bytes and starts anew."""

    def __init__(self) -> None:
        self._parts: list[bytes | memoryview] = []
        self.data_bytes = 0  # layer bytes added since the last take()

    def add_header(self, header: bytes) -> None:
        self._parts += [_HEADER_TAG, _varint(len(header)), header]

    def add_slice(self, chunk_index: int, layer: int, data: Sequence[memoryview]) -> None:
        size = sum(view.nbytes for view in data)
        fields = (
            _CHUNK_INDEX_TAG + _varint(chunk_index) + _LAYER_TAG + _varint(layer) + _DATA_TAG + _varint(size)
        )
        self._parts += [_SLICE_TAG, _varint(len(fields) + size), fields, *data]
        self.data_bytes += size

    def take(self) -> bytes:
        message = b"".join(self._parts)
        self._parts, self.data_bytes = [], 0
        return message
