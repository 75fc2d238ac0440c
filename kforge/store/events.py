"""The store's event log as a closed set of typed records, and their one row encoding.

Every change the store commits appends one ``events`` row (a kind and a JSON payload) that viewers
tail. This module is the only place the kind strings and payload keys are spelled: the store
writes records through ``to_row``, readers get records from ``from_row`` and match on their types.

A row of a kind this kforge does not know (written by a newer kforge) decodes to ``UnknownEvent``
rather than failing, so an older viewer keeps following a session that a newer engine writes. A
row of a known kind without a payload key it needs is corrupt and raises ``EventFormatError``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kforge.core.candidate import ModelMeasured
from kforge.errors import KforgeError


class EventFormatError(KforgeError):
    """A stored event of a known kind whose payload lacks a key or holds a wrong value."""


@dataclass(frozen=True)
class SessionCreated:
    model: str
    status: str


@dataclass(frozen=True)
class SessionStatusChanged:
    status: str
    error: str = ""


@dataclass(frozen=True)
class SessionSettingsChanged:
    changes: dict[str, Any]


@dataclass(frozen=True)
class SessionDeleted:
    pass


@dataclass(frozen=True)
class EngineAttached:
    pid: int
    host: str


@dataclass(frozen=True)
class CardsAdded:
    count: int


@dataclass(frozen=True)
class CardUpdated:
    """A card's search state changed; ``changes`` holds the new column values (never the
    baseline, which is too large for the log)."""

    card_id: int
    changes: dict[str, Any]


@dataclass(frozen=True)
class NodeAdded:
    node_id: int
    card_id: int
    parent_id: int | None
    action: str


@dataclass(frozen=True)
class NodeUpdated:
    node_id: int
    card_id: int
    status: str


@dataclass(frozen=True)
class NodeFinished:
    node_id: int
    card_id: int
    status: str
    speedup: float | None = None


@dataclass(frozen=True)
class NodeDeleted:
    node_id: int
    card_id: int


@dataclass(frozen=True)
class NodePruned:
    node_id: int
    card_id: int
    pruned: bool


@dataclass(frozen=True)
class CommandSent:
    command_id: int
    command: str
    arg: Any = None


@dataclass(frozen=True)
class CommandDone:
    command_id: int
    result: str = ""


@dataclass(frozen=True)
class LogLine:
    message: str
    level: str = "info"


@dataclass(frozen=True)
class UnknownEvent:
    """A row of a kind this kforge does not know, kept as stored."""

    kind: str
    data: dict[str, Any] = field(default_factory=dict)


EventRecord = (SessionCreated | SessionStatusChanged | SessionSettingsChanged | SessionDeleted
               | EngineAttached | CardsAdded | CardUpdated | NodeAdded | NodeUpdated | NodeFinished
               | NodeDeleted | NodePruned | CommandSent | CommandDone | LogLine | ModelMeasured
               | UnknownEvent)


@dataclass(frozen=True)
class Event:
    """One row of the log: its place in it, the session it concerns, when, and what happened."""

    seq: int
    session_id: int | None
    at: float
    record: EventRecord


@dataclass(frozen=True)
class _Codec:
    kind: str
    type: type
    encode: Callable[[Any], dict[str, Any]]
    decode: Callable[[dict[str, Any]], EventRecord]


def _card_updated(data: dict[str, Any]) -> CardUpdated:
    changes = dict(data)
    return CardUpdated(card_id=changes.pop("card_id"), changes=changes)


def _figures(data: Any, kind: type = float) -> dict:
    """A stored mapping of modes to figures (each made a ``kind``): times, ratios and spreads
    above zero (readers divide by them), counts of zero or more; anything else is a corrupt
    payload."""
    if isinstance(data, dict) and all(_measured(value, kind) for value in data.values()):
        return {str(mode): kind(value) for mode, value in data.items()}
    raise EventFormatError(f"event 'model_measured' holds {data!r} where a mapping of modes to "
                           "figures belongs")


def _figure(value: Any) -> float:
    """A measurement's one figure (its projection), checked as ``_figures`` checks each."""
    if _measured(value, float):
        return float(value)
    raise EventFormatError(f"event 'model_measured' holds {value!r} where a figure belongs")


def _measured(value: Any, kind: type) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return False
    return value >= 0 if kind is int else value > 0


_CODECS = (
    _Codec("session_created", SessionCreated,
           lambda e: {"model": e.model, "status": e.status},
           lambda d: SessionCreated(model=d["model"], status=d["status"])),
    _Codec("session_status", SessionStatusChanged,
           lambda e: {"status": e.status, "error": e.error},
           lambda d: SessionStatusChanged(status=d["status"], error=d.get("error", ""))),
    _Codec("session_settings", SessionSettingsChanged,
           lambda e: {"changes": e.changes},
           lambda d: SessionSettingsChanged(changes=d["changes"])),
    _Codec("session_deleted", SessionDeleted,
           lambda e: {},
           lambda d: SessionDeleted()),
    _Codec("engine_attached", EngineAttached,
           lambda e: {"pid": e.pid, "host": e.host},
           lambda d: EngineAttached(pid=d["pid"], host=d["host"])),
    _Codec("cards_added", CardsAdded,
           lambda e: {"count": e.count},
           lambda d: CardsAdded(count=d["count"])),
    # The changed columns sit beside card_id at the top level of the payload.
    _Codec("card_updated", CardUpdated,
           lambda e: {"card_id": e.card_id, **e.changes},
           _card_updated),
    _Codec("node_added", NodeAdded,
           lambda e: {"node_id": e.node_id, "card_id": e.card_id, "parent_id": e.parent_id,
                      "action": e.action},
           lambda d: NodeAdded(node_id=d["node_id"], card_id=d["card_id"],
                               parent_id=d["parent_id"], action=d["action"])),
    _Codec("node_updated", NodeUpdated,
           lambda e: {"node_id": e.node_id, "card_id": e.card_id, "status": e.status},
           lambda d: NodeUpdated(node_id=d["node_id"], card_id=d["card_id"], status=d["status"])),
    _Codec("node_finished", NodeFinished,
           lambda e: {"node_id": e.node_id, "card_id": e.card_id, "status": e.status,
                      "speedup": e.speedup},
           lambda d: NodeFinished(node_id=d["node_id"], card_id=d["card_id"], status=d["status"],
                                  speedup=d.get("speedup"))),
    _Codec("node_deleted", NodeDeleted,
           lambda e: {"node_id": e.node_id, "card_id": e.card_id},
           lambda d: NodeDeleted(node_id=d["node_id"], card_id=d["card_id"])),
    _Codec("node_pruned", NodePruned,
           lambda e: {"node_id": e.node_id, "card_id": e.card_id, "pruned": e.pruned},
           lambda d: NodePruned(node_id=d["node_id"], card_id=d["card_id"],
                                pruned=bool(d["pruned"]))),
    # The command's own kind is stored under "kind" inside the payload.
    _Codec("command", CommandSent,
           lambda e: {"command_id": e.command_id, "kind": e.command, "arg": e.arg},
           lambda d: CommandSent(command_id=d["command_id"], command=d["kind"],
                                 arg=d.get("arg"))),
    _Codec("command_done", CommandDone,
           lambda e: {"command_id": e.command_id, "result": e.result},
           lambda d: CommandDone(command_id=d["command_id"], result=str(d.get("result", "")))),
    _Codec("log", LogLine,
           lambda e: {"level": e.level, "message": e.message},
           lambda d: LogLine(message=str(d.get("message", "")), level=d.get("level", "info"))),
    # times_us, kernels and spreads are absent from measurements stored before they existed.
    _Codec("model_measured", ModelMeasured,
           lambda e: {"speedups": e.speedups, "gains": e.gains, "projected": e.projected,
                      "times_us": e.times_us, "kernels": e.kernels, "spreads": e.spreads},
           lambda d: ModelMeasured(speedups=_figures(d["speedups"]), gains=_figures(d["gains"]),
                                   projected=_figure(d["projected"]),
                                   times_us=_figures(d.get("times_us", {})),
                                   kernels=_figures(d.get("kernels", {}), int),
                                   spreads=_figures(d.get("spreads", {})))),
)
_BY_KIND = {c.kind: c for c in _CODECS}
_BY_TYPE = {c.type: c for c in _CODECS}

KINDS: frozenset[str] = frozenset(_BY_KIND)
RECORD_TYPES: tuple[type, ...] = tuple(_BY_TYPE)


def kind_of(record_type: type) -> str:
    """The stored kind of a record type, for queries that filter the log by kind."""
    try:
        return _BY_TYPE[record_type].kind
    except KeyError:
        raise EventFormatError(f"{record_type.__name__} is not a stored event type") from None


def to_row(record: EventRecord) -> tuple[str, dict[str, Any]]:
    """The ``(kind, payload)`` a record is stored as."""
    if isinstance(record, UnknownEvent):
        return record.kind, dict(record.data)
    return kind_of(type(record)), _BY_TYPE[type(record)].encode(record)


def from_row(kind: str, data: dict[str, Any]) -> EventRecord:
    """The record a stored ``(kind, payload)`` holds; ``UnknownEvent`` for a kind not known here."""
    if not isinstance(data, dict):
        raise EventFormatError(f"event {kind!r} has a payload that is not an object: {data!r}")
    codec = _BY_KIND.get(kind)
    if codec is None:
        return UnknownEvent(kind=kind, data=dict(data))
    try:
        return codec.decode(data)
    except KeyError as exc:
        raise EventFormatError(f"event {kind!r} lacks its payload key {exc}") from None
