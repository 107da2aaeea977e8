"""Checks on request fields, with messages that name the field and the limit."""

from __future__ import annotations

from collections.abc import Sequence

from attnstore.chunks.keys import KEY_BYTES, NAMESPACE_BYTES
from attnstore.errors import InvalidArgument, OutOfRange


def check_namespace(namespace: bytes) -> bytes:
    if len(namespace) != NAMESPACE_BYTES:
        raise InvalidArgument(f"namespace must be {NAMESPACE_BYTES} bytes, got {len(namespace)}")
    return namespace


def check_keys(
    keys: Sequence[bytes], max_keys: int, *, field: str = "keys", unique: bool = False
) -> list[bytes]:
    if len(keys) > max_keys:
        raise InvalidArgument(f"{field} holds {len(keys)} keys; at most {max_keys} are allowed per call")
    for index, key in enumerate(keys):
        if len(key) != KEY_BYTES:
            raise InvalidArgument(
                f"{field}[{index}] must be a {KEY_BYTES}-byte chunk key, got {len(key)} bytes"
            )
    if unique:
        _check_no_repeated_key(keys, field)
    return list(keys)


def _check_no_repeated_key(keys: Sequence[bytes], field: str) -> None:
    """A key named twice in one call would be read (and counted as a hit) twice."""
    first: dict[bytes, int] = {}
    for index, key in enumerate(keys):
        earlier = first.setdefault(key, index)
        if earlier != index:
            raise InvalidArgument(
                f"{field} must not repeat a key: {field}[{index}] repeats {field}[{earlier}] ({key.hex()})"
            )


MAX_BORROWER_CHARS = 128


def check_borrower(borrower: str) -> str:
    """A pool borrower's node name: short, so it can label a metric and mark an SSD file's
    name (base64 of its UTF-8 bytes: 171 characters at most, within a file name's 255)."""
    if len(borrower) > MAX_BORROWER_CHARS:
        raise InvalidArgument(
            f"borrower must be at most {MAX_BORROWER_CHARS} characters, got {len(borrower)}"
        )
    if len(borrower.encode()) > MAX_BORROWER_CHARS:
        raise InvalidArgument(
            f"borrower must be at most {MAX_BORROWER_CHARS} bytes in UTF-8, got {len(borrower.encode())}"
        )
    return borrower


def check_nonempty(values: Sequence[object], field: str) -> None:
    if not values:
        raise InvalidArgument(f"{field} must not be empty")


def check_ttl(ttl_seconds: int, default: float, maximum: float, field: str) -> float:
    """0 selects the default; anything above the configured maximum is refused."""
    if ttl_seconds == 0:
        return default
    if ttl_seconds > maximum:
        raise InvalidArgument(f"{field} of {ttl_seconds}s exceeds the maximum of {maximum:g}s")
    return float(ttl_seconds)


def check_layer_range(layer_start: int, layer_end: int, num_layers: int) -> tuple[int, int]:
    end = layer_end or num_layers
    if not 0 <= layer_start < end <= num_layers:
        raise OutOfRange(f"layer range [{layer_start}, {end}) is outside the namespace's {num_layers} layers")
    return layer_start, end


def check_unique_ids(ids: Sequence[int], max_ids: int, field: str, *, allow_empty: bool = False) -> list[int]:
    if not allow_empty:
        check_nonempty(ids, field)
    if len(ids) > max_ids:
        raise InvalidArgument(f"{field} holds {len(ids)} ids; at most {max_ids} are allowed per call")
    if len(set(ids)) != len(ids):
        raise InvalidArgument(f"{field} must not repeat an id")
    return list(ids)
