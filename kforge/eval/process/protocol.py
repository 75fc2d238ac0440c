"""The messages between the engine and an evaluation worker, and their one wire encoding.

A frame is a 4-byte big-endian length and that many bytes of UTF-8 JSON: one object whose ``kind``
names the message. The worker first says hello (``Ready`` or ``Fatal``), then answers each request
with one reply carrying the request's ``id``. This module is the only place the kind names and
keys are spelled; both sides build and match the typed messages below.
"""

from __future__ import annotations

import asyncio
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from kforge.core.candidate import Baseline, Candidate, EvalOutcome
from kforge.core.gpu import GpuInfo
from kforge.core.opcard import OpCard
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


@dataclass(frozen=True)
class _Codec:
    kind: str
    type: type
    encode: Callable[[Any], dict[str, Any]]
    decode: Callable[[dict[str, Any]], Message]


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


_CODECS = (
    _Codec("ready", Ready,
           lambda m: {"gpu": m.gpu.to_dict()},
           lambda d: Ready(gpu=GpuInfo.from_dict(d["gpu"]))),
    _Codec("fatal", Fatal,
           lambda m: {"error": m.error},
           lambda d: Fatal(error=d["error"])),
    _Codec("evaluate", Evaluate,
           lambda m: {"id": m.id, "card": m.card.to_dict(), "candidate": m.candidate.to_dict(),
                      "samples_dir": str(m.samples_dir) if m.samples_dir else None,
                      "settings": m.settings},
           lambda d: Evaluate(id=d["id"], card=OpCard.from_dict(d["card"]),
                              candidate=Candidate.from_dict(d["candidate"]),
                              samples_dir=_path(d["samples_dir"]), settings=d["settings"])),
    _Codec("measure_baseline", MeasureBaseline,
           lambda m: {"id": m.id, "card": m.card.to_dict(),
                      "samples_dir": str(m.samples_dir) if m.samples_dir else None,
                      "settings": m.settings},
           lambda d: MeasureBaseline(id=d["id"], card=OpCard.from_dict(d["card"]),
                                     samples_dir=_path(d["samples_dir"]), settings=d["settings"])),
    _Codec("ping", Ping,
           lambda m: {"id": m.id},
           lambda d: Ping(id=d["id"])),
    _Codec("shutdown", Shutdown,
           lambda m: {},
           lambda d: Shutdown()),
    _Codec("evaluated", Evaluated,
           lambda m: {"id": m.id, "outcome": m.outcome.to_dict(), "restart": m.restart},
           lambda d: Evaluated(id=d["id"], outcome=EvalOutcome.from_dict(d["outcome"]),
                               restart=d["restart"])),
    _Codec("baseline_measured", BaselineMeasured,
           lambda m: {"id": m.id, "baseline": m.baseline.to_dict()},
           lambda d: BaselineMeasured(id=d["id"], baseline=Baseline.from_dict(d["baseline"]))),
    _Codec("pong", Pong,
           lambda m: {"id": m.id},
           lambda d: Pong(id=d["id"])),
    _Codec("failed", Failed,
           lambda m: {"id": m.id, "error": m.error, "traceback": m.traceback,
                      "restart": m.restart},
           lambda d: Failed(id=d["id"], error=d["error"], traceback=d["traceback"],
                            restart=d["restart"])),
)
_BY_KIND = {c.kind: c for c in _CODECS}
_BY_TYPE = {c.type: c for c in _CODECS}
_KIND_KEY = "kind"


def _to_json(message: Message) -> dict[str, Any]:
    """The JSON object a message travels as."""
    codec = _BY_TYPE.get(type(message))
    if codec is None:
        raise ProtocolError(f"{type(message).__name__} is not a worker message")
    return {_KIND_KEY: codec.kind, **codec.encode(message)}


def _from_json(data: Any) -> Message:
    """The message a received JSON object holds."""
    if not isinstance(data, dict):
        raise ProtocolError("frame is not a JSON object")
    kind = data.get(_KIND_KEY)
    codec = _BY_KIND.get(kind) if isinstance(kind, str) else None
    if codec is None:
        raise ProtocolError(f"unknown message kind {kind!r}")
    try:
        return codec.decode(data)
    except KeyError as exc:
        raise ProtocolError(f"message {kind!r} lacks its key {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ProtocolError(f"message {kind!r} is malformed: {exc}") from None


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
