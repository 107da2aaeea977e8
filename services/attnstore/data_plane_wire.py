"""The data plane's wire format, shared by the daemon's server and the client SDK.

A connection carries frames and raw payloads on one TCP (or TLS) stream:

    frame   = uint32 big-endian length, then that many bytes of one msgpack map
    payload = raw bytes whose length an earlier frame declared

Client                                   Daemon
  {"op": "hello", "token": t|None}   ->
                                     <-  {"ok": true}
  {"op": "get", "namespace", "keys": [k...] | "lease", "chunks": [i...],
   "layer_start", "layer_end",
   "unheld": bool (keys only)}       ->
                                     <-  {"ok": true, "headers": [bytes...], "trailer": bool}
                                     <-  payload: layer start of each named chunk, then
                                         the next layer... (layer-major)
                                     <-  with "trailer": {"ok": true, "valid": bool}

`unheld`: the reader accepts chunks sent from the daemon's DRAM without a reader taken
on them (no hop to its event loop); the daemon then answers "trailer" and, after the
payload, whether the chunks stayed in their blocks while they were sent (a seqlock read).
`valid` false: the payload is not the chunks'; the reader asks again without `unheld`.
  {"op": "put", "namespace",
   "writes": [[write_id, bytes]...]} ->
  payload: each write's bytes        ->
                                     <-  {"ok": true, "bytes_written": n}

Any refusal is `{"ok": false, "code": "NotFound", "message": ...}` (the name of an
attnstore.errors class), after which the daemon closes the connection: a stream cannot
be resynchronised once a payload may be in flight, and reconnecting is cheap.
"""

from __future__ import annotations

import socket
import ssl
import struct
from collections.abc import Sequence
from typing import Any

import msgpack

from attnstore import errors

LENGTH = struct.Struct("!I")
# sendmsg takes at most IOV_MAX (1024 on Linux) buffers per call.
MAX_IOVECS = 1024


class FrameError(errors.InvalidArgument):
    """A frame that is not a msgpack map of the expected shape, or is too long."""


class ConnectionClosed(errors.Unavailable):
    """The peer closed the stream before a frame or payload was complete."""


def pack_frame(message: dict[str, Any]) -> bytes:
    payload = msgpack.packb(message)
    return LENGTH.pack(len(payload)) + payload


def send_frame(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(pack_frame(message))


def recv_frame(sock: socket.socket, max_bytes: int) -> dict[str, Any]:
    """The next frame's map; FrameError for a length over `max_bytes` or bad msgpack."""
    prefix = bytearray(LENGTH.size)
    recv_exactly_into(sock, memoryview(prefix))
    body = bytearray(frame_length(LENGTH.unpack(prefix)[0], max_bytes))
    recv_exactly_into(sock, memoryview(body))
    return decode_frame(body)


def frame_length(length: int, max_bytes: int) -> int:
    """`length`, a frame's declared length; FrameError when over `max_bytes`."""
    if length > max_bytes:
        raise FrameError(f"frame of {length} bytes exceeds the {max_bytes}-byte limit")
    return int(length)


def decode_frame(body: bytearray) -> dict[str, Any]:
    """A frame's body as its map; FrameError when it is not msgpack or not a map."""
    try:
        message = msgpack.unpackb(body)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
        raise FrameError(f"frame is not msgpack: {exc}") from exc
    if not isinstance(message, dict):
        raise FrameError("frame is not a msgpack map")
    return message


def recv_exactly_into(sock: socket.socket, view: memoryview) -> None:
    """Fills `view` from the stream (recv_into: no intermediate copy)."""
    while view.nbytes:
        received = sock.recv_into(view)
        if received == 0:
            raise ConnectionClosed("the peer closed the data-plane connection mid-transfer")
        view = view[received:]


def recv_views(sock: socket.socket, views: Sequence[memoryview]) -> None:
    """Fills the views in order from the stream: one recvmsg_into (scatter read) per batch
    on a plain socket, not a recv per view (a 0.5 MB chunk is 30 layer views); TLS
    sockets have no recvmsg_into, so one recv_into per view."""
    if isinstance(sock, ssl.SSLSocket):
        for view in views:
            recv_exactly_into(sock, view)
        return
    pending = [v.cast("B") for v in views if v.nbytes]
    while pending:
        received = sock.recvmsg_into(pending[:MAX_IOVECS], 0, socket.MSG_WAITALL)[0]
        if received == 0:
            raise ConnectionClosed("the peer closed the data-plane connection mid-transfer")
        advance(pending, received)


def advance(pending: list[memoryview], done: int) -> None:
    """Drops the first `done` bytes of `pending` (views sent or received)."""
    while done:
        if done >= pending[0].nbytes:
            done -= pending.pop(0).nbytes
        else:
            pending[0] = pending[0][done:]
            done = 0


def send_views(sock: socket.socket, views: Sequence[memoryview]) -> None:
    """Sends the views back to back without joining them: one sendmsg (gather write) per
    batch on a plain socket; TLS sockets have no sendmsg, so one sendall per view."""
    if isinstance(sock, ssl.SSLSocket):
        for view in views:
            sock.sendall(view)
        return
    pending = [v.cast("B") for v in views if v.nbytes]
    while pending:
        advance(pending, sock.sendmsg(pending[:MAX_IOVECS]))


def error_frame(exc: errors.ServiceError) -> dict[str, Any]:
    """The refusal naming the attnstore.errors class `exc` is (FrameError: InvalidArgument)."""
    code = next(cls.__name__ for cls in type(exc).__mro__ if errors.ServiceError in cls.__bases__)
    return {"ok": False, "code": code, "message": str(exc)}


_ERRORS: dict[str, type[errors.ServiceError]] = {
    cls.__name__: cls for cls in errors.ServiceError.__subclasses__()
}


def raise_for_reply(reply: dict[str, Any]) -> dict[str, Any]:
    """`reply` if it says ok, else the ServiceError it names (Unavailable when unknown)."""
    if reply.get("ok") is True:
        return reply
    cls = _ERRORS.get(str(reply.get("code")), errors.Unavailable)
    raise cls(f"data plane: {reply.get('message', 'refused')}")


def field(message: dict[str, Any], name: str, kind: type | tuple[type, ...]) -> Any:
    """message[name] if it is a `kind`; FrameError otherwise (bool is not an int here)."""
    value = message.get(name)
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is int):
        raise FrameError(f"frame field {name!r} must be {getattr(kind, '__name__', kind)}")
    return value
