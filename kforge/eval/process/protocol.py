"""The messages between the engine and an evaluation worker, and their one wire encoding.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON: one object whose ``kind``
names the message and whose other keys are its fields, as the codec (``kforge.core.schema``)
writes and reads them. The worker first says hello (``Ready`` or ``Fatal``), then answers each
request with one reply carrying the request's ``id``. This module is the only place the kind
names and keys are spelled: each message is a record declared below, named in the one table
``KINDS``; both sides build and match those records.
"""

from __future__ import annotations

import asyncio
import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from kforge.core import schema
from kforge.core.candidate import Baseline, Candidate, EvalOutcome
from kforge.core.gpu import GpuInfo
from kforge.core.opcard import OpCard
from kforge.core.schema import Origin, SchemaError
from kforge.errors import KforgeError

HEADER = struct.Struct(">I")
MAX_FRAME = 64 << 20


class ProtocolError(KforgeError):
    """A malformed frame or message: the peer is not speaking this protocol."""


# ----- the worker's hello -----


@dataclass(frozen=True)
class Ready:
    gpu: GpuInfo


@dataclass(frozen=True)
class Fatal:
    """The worker cannot run (no GPU, no NVRTC...) and exits."""

    error: str


# ----- requests from the engine -----


@dataclass(frozen=True)
class Evaluate:
    card: OpCard
    candidate: Candidate
    samples_dir: Path | None = None
    settings: dict[str, Any] = field(default_factory=dict)  # read by EvalSettings.from_dict
    id: int = 0


@dataclass(frozen=True)
class MeasureBaseline:
    card: OpCard
    samples_dir: Path | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    id: int = 0


@dataclass(frozen=True)
class Ping:
    id: int = 0


@dataclass(frozen=True)
class Shutdown:
    pass


# ----- replies from the worker -----


@dataclass(frozen=True)
class Evaluated:
    """The verdict; ``restart`` says the worker exits after this reply (its GPU context is dead
    or the candidate tampered with the process) and a fresh one must take the GPU over."""

    outcome: EvalOutcome
    restart: bool = False
    id: int = 0


@dataclass(frozen=True)
class BaselineMeasured:
    baseline: Baseline
    id: int = 0


@dataclass(frozen=True)
class Pong:
    id: int = 0


@dataclass(frozen=True)
class Failed:
    """The evaluator itself failed on a request (not the candidate); ``restart`` as in
    ``Evaluated``."""

    error: str
    traceback: str = ""
    restart: bool = False
    id: int = 0


Hello = Ready | Fatal
Request = Evaluate | MeasureBaseline | Ping | Shutdown
Reply = Evaluated | BaselineMeasured | Pong | Failed
Message = Hello | Request | Reply


def worker_exits_after(reply: Reply) -> bool:
    """Whether the worker ends after sending ``reply``, so a fresh one must take its GPU over."""
    return isinstance(reply, Evaluated | Failed) and reply.restart


# ----- the encoding -----

# The one table of kinds: each message travels as its fields (``kforge.core.schema``) beside
# ``"kind": <its name here>``.
KINDS: dict[str, type] = {
    "ready": Ready, "fatal": Fatal, "evaluate": Evaluate, "measure_baseline": MeasureBaseline,
    "ping": Ping, "shutdown": Shutdown, "evaluated": Evaluated,
    "baseline_measured": BaselineMeasured, "pong": Pong, "failed": Failed}
_KIND_OF = {kind: name for name, kind in KINDS.items()}
_KIND_KEY = "kind"


def _to_json(message: Message) -> dict[str, Any]:
    """The JSON object a message travels as."""
    kind = _KIND_OF.get(type(message))
    if kind is None:
        raise ProtocolError(f"{type(message).__name__} is not a worker message")
    return {_KIND_KEY: kind, **schema.encode(message)}


def _from_json(data: Any) -> Message:
    """The message a received JSON object holds; the one place a malformed one is refused."""
    if not isinstance(data, dict):
        raise ProtocolError("frame is not a JSON object")
    kind = data.get(_KIND_KEY)
    message_type = KINDS.get(kind) if isinstance(kind, str) else None
    if message_type is None:
        raise ProtocolError(f"unknown message kind {kind!r}")
    body = {key: value for key, value in data.items() if key != _KIND_KEY}
    try:
        return schema.read(message_type, body, Origin.record(whole=True))
    except SchemaError as exc:
        if exc.missing:
            raise ProtocolError(f"message {kind!r} lacks its key {exc.name!r}") from None
        raise ProtocolError(f"message {kind!r} is malformed: {exc.name} {exc.problem}") from None


def encode(message: Message) -> bytes:
    """One frame holding ``message``."""
    payload = json.dumps(_to_json(message), separators=(",", ":")).encode()
    if len(payload) > MAX_FRAME:
        raise ProtocolError(f"message of {len(payload)} bytes exceeds {MAX_FRAME}")
    return HEADER.pack(len(payload)) + payload


def decode(payload: bytes) -> Message:
    """The message in one frame's payload."""
    try:
        data = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"frame is not JSON: {exc}") from None
    return _from_json(data)


def _length(header: bytes) -> int:
    (length,) = HEADER.unpack(header)
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes exceeds {MAX_FRAME}")
    return length


def read_frame(stream: BinaryIO) -> Message | None:
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


def read_request(stream: BinaryIO) -> Request | None:
    """The next request from a blocking stream (the worker's side); None at a clean end."""
    message = read_frame(stream)
    if message is not None and not isinstance(message, Request):
        raise ProtocolError(f"{type(message).__name__} is not a request")
    return message


def write_frame(stream: BinaryIO, message: Message) -> None:
    stream.write(encode(message))
    stream.flush()


async def read_frame_async(reader: asyncio.StreamReader) -> Message:
    """The next message; raises EOFError when the peer has gone."""
    try:
        header = await reader.readexactly(HEADER.size)
        payload = await reader.readexactly(_length(header))
    except asyncio.IncompleteReadError:
        raise EOFError("the worker closed its output") from None
    return decode(payload)
