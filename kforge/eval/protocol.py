"""The messages between the engine and an evaluation worker: length-prefixed JSON frames.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON (one object). The worker
answers each request with one frame carrying the request's ``id``.
"""

from __future__ import annotations

import asyncio
import json
import struct
from typing import BinaryIO

HEADER = struct.Struct(">I")
MAX_FRAME = 64 << 20


class ProtocolError(Exception):
    """A malformed frame: the peer is not speaking this protocol."""


def encode(message: dict) -> bytes:
    payload = json.dumps(message, separators=(",", ":")).encode()
    if len(payload) > MAX_FRAME:
        raise ProtocolError(f"message of {len(payload)} bytes exceeds {MAX_FRAME}")
    return HEADER.pack(len(payload)) + payload


def decode(payload: bytes) -> dict:
    try:
        message = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"frame is not JSON: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError("frame is not a JSON object")
    return message


def _length(header: bytes) -> int:
    (length,) = HEADER.unpack(header)
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes exceeds {MAX_FRAME}")
    return length


def read_frame(stream: BinaryIO) -> dict | None:
    """The next message from a blocking stream; None at a clean end of stream."""
    header = stream.read(HEADER.size)
    if not header:
        return None
    if len(header) < HEADER.size:
        raise ProtocolError("stream ended inside a frame header")
    length = _length(header)
    payload = stream.read(length)
    if len(payload) < length:
        raise ProtocolError("stream ended inside a frame")
    return decode(payload)


def write_frame(stream: BinaryIO, message: dict) -> None:
    stream.write(encode(message))
    stream.flush()


async def read_frame_async(reader: asyncio.StreamReader) -> dict:
    """The next message; raises EOFError when the peer has gone."""
    try:
        header = await reader.readexactly(HEADER.size)
        payload = await reader.readexactly(_length(header))
    except asyncio.IncompleteReadError:
        raise EOFError("the worker closed its output") from None
    return decode(payload)
