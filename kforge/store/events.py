"""The store's event log as a closed set of typed records, and their one row encoding.

Every change the store commits appends one ``events`` row (a kind and a JSON payload) that viewers
tail. This module is the only place the kind strings and payload keys are spelled: each event is a
record declared below, named in the one table ``EVENTS``, and stored as its fields by the codec
(``kforge.core.schema``). The store writes records through ``to_row``, readers get records from
``from_row`` and match on their types.

A row of a kind this kforge does not know (written by a newer kforge) decodes to ``UnknownEvent``
rather than failing, so an older viewer keeps following a session that a newer engine writes. A
row of a known kind without a payload key it needs is corrupt and raises ``EventFormatError``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kforge.core import schema
from kforge.core.candidate import ModelMeasured
from kforge.core.schema import Origin, Rule, SchemaError, checked, spread
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
    changes: dict[str, Any] = spread()  # stored beside card_id


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
    command: str = checked(stored_as="kind")
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


# The one table of kinds: each record is stored as its fields (``kforge.core.schema``) under the
# kind named here; a field added later has a default, which rows stored before it read as.
EVENTS: dict[str, type] = {
    "session_created": SessionCreated, "session_status": SessionStatusChanged,
    "session_settings": SessionSettingsChanged, "session_deleted": SessionDeleted,
    "engine_attached": EngineAttached, "cards_added": CardsAdded, "card_updated": CardUpdated,
    "node_added": NodeAdded, "node_updated": NodeUpdated, "node_finished": NodeFinished,
    "node_deleted": NodeDeleted, "node_pruned": NodePruned, "command": CommandSent,
    "command_done": CommandDone, "log": LogLine, "model_measured": ModelMeasured}
_KIND_OF = {record_type: kind for kind, record_type in EVENTS.items()}

# The value rules of a record declared elsewhere: a measurement's times, ratios and spreads are
# above zero (readers divide by them), its kernel counts zero or more.
_FIGURE = Rule(finite=True, above=0)
RULES: dict[type, dict[str, Rule]] = {ModelMeasured: {
    "speedups": _FIGURE, "gains": _FIGURE, "projected": _FIGURE, "times_us": _FIGURE,
    "spreads": _FIGURE, "kernels": Rule(least=0)}}

KINDS: frozenset[str] = frozenset(EVENTS)
RECORD_TYPES: tuple[type, ...] = tuple(EVENTS.values())


def kind_of(record_type: type) -> str:
    """The stored kind of a record type, for queries that filter the log by kind."""
    try:
        return _KIND_OF[record_type]
    except KeyError:
        raise EventFormatError(f"{record_type.__name__} is not a stored event type") from None


def to_row(record: EventRecord) -> tuple[str, dict[str, Any]]:
    """The ``(kind, payload)`` a record is stored as."""
    if isinstance(record, UnknownEvent):
        return record.kind, dict(record.data)
    return kind_of(type(record)), schema.encode(record)


def from_row(kind: str, data: dict[str, Any]) -> EventRecord:
    """The record a stored ``(kind, payload)`` holds; ``UnknownEvent`` for a kind not known here.
    The one place a damaged payload is refused."""
    if not isinstance(data, dict):
        raise EventFormatError(f"event {kind!r} has a payload that is not an object: {data!r}")
    record_type = EVENTS.get(kind)
    if record_type is None:
        return UnknownEvent(kind=kind, data=dict(data))
    try:
        return schema.read(record_type, data, Origin.record(), rules=RULES.get(record_type))
    except SchemaError as exc:
        if exc.missing:
            raise EventFormatError(f"event {kind!r} lacks its payload key {exc.name!r}") from None
        raise EventFormatError(f"event {kind!r} holds a bad value: {exc.name} "
                               f"{exc.problem}") from None
