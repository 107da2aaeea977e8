"""Tensors on the micro-attention wire (attnstore.worker.v1.Tensor): row-major bytes with
their shape and element type, checked on arrival (a short or long buffer, an unknown type
or a shape that is not the one expected is the caller's mistake, not ours); and the digest
of a layer's KV, by which a segment's home checks that what a peer read or attended is
the KV it uploaded (remote.py)."""

from __future__ import annotations

import math
import zlib

import torch

from attnstore.errors import InvalidArgument
from attnstore.worker.v1 import micro_attention_pb2 as pb
from inference_worker.kv_codec import DTYPE_NAMES, TORCH_DTYPES


def to_wire(tensor: torch.Tensor) -> pb.Tensor:
    flat = tensor.detach().contiguous().cpu()
    return pb.Tensor(
        shape=list(flat.shape),
        dtype=DTYPE_NAMES[flat.dtype],
        data=flat.view(-1).view(torch.uint8).numpy().tobytes(),
    )


def from_wire(message: pb.Tensor, name: str, dims: int) -> torch.Tensor:
    """The tensor `message` carries (a CPU tensor over a copy of its bytes); InvalidArgument
    unless it has `dims` dimensions, a known type and exactly its bytes."""
    if message.dtype not in TORCH_DTYPES:
        raise InvalidArgument(f"{name}: dtype {message.dtype!r} is not one of {sorted(TORCH_DTYPES)}")
    if len(message.shape) != dims or 0 in message.shape:
        raise InvalidArgument(f"{name}: shape {list(message.shape)} is not {dims} non-zero sizes")
    dtype = TORCH_DTYPES[message.dtype]
    expected = math.prod(message.shape) * dtype.itemsize
    if len(message.data) != expected:
        raise InvalidArgument(
            f"{name}: {len(message.data)} bytes for shape {list(message.shape)} of {message.dtype} ({expected})"
        )
    return torch.frombuffer(bytearray(message.data), dtype=dtype).view(*message.shape)


def crc(tensor: torch.Tensor, previous: int = 0) -> int:
    """CRC-32 of the tensor's row-major bytes, continuing `previous` (the CRC of bytes
    before them: a CRC over pieces appended one after another is the CRC of the whole)."""
    flat = tensor.detach().contiguous().cpu()
    return zlib.crc32(flat.view(-1).view(torch.uint8).numpy(), previous)


def layer_digest(key_crc: int, value_crc: int) -> int:
    """One layer's digest: the CRC-32 of its keys' bytes [tokens, KVH, D] beside its values'."""
    return key_crc << 32 | value_crc
