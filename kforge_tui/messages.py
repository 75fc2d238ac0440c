"""Messages workers post to the screens: data arrived, or something went wrong (one error path)."""

from __future__ import annotations

from dataclasses import dataclass, field

from textual.message import Message

from kforge.core.candidate import Candidate
from kforge.store.events import ModelMeasured
from kforge.store.records import CardRow, NodeDetail, NodeRow, Session, SessionSummary


class ErrorRaised(Message):
    """A user-facing problem (a KforgeError's text); the app shows it in its error notice."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class Notice(Message):
    """A short piece of news for the user (a command's result)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class SearchNotRunning(Message):
    """A command only a running search carries out found none; the screen offers to start it."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class DatabaseUnreadable(Message):
    """The session database cannot be opened or read (corrupt, locked, not a kforge database)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class SessionsLoaded(Message):
    def __init__(self, summaries: list[SessionSummary], alive: dict[int, bool]) -> None:
        super().__init__()
        self.summaries = summaries
        self.alive = alive


@dataclass
class SessionState:
    """What a session screen shows, as last read from the store."""

    session: Session
    cards: list[CardRow]
    alive: bool
    measured: ModelMeasured | None = None  # the latest whole-model measurement (kforge e2e)


class SessionSnapshot(Message):
    """The whole session at attach time: the state, every node and the log's tail."""

    def __init__(self, state: SessionState, nodes: list[NodeRow], log: list[str]) -> None:
        super().__init__()
        self.state = state
        self.nodes = nodes
        self.log = log


@dataclass
class Changes:
    """What changed since the last poll, already fetched from the store."""

    state: SessionState | None = None  # set when the session row or a card changed
    nodes: list[NodeRow] = field(default_factory=list)
    deleted: list[int] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    results: list[str] = field(default_factory=list)  # the engine's answers to commands
    gone: bool = False  # the session was deleted
    ended: tuple[str, str] | None = None  # its search ended: the status, and why (or "")


class SessionChanged(Message):
    def __init__(self, changes: Changes) -> None:
        super().__init__()
        self.changes = changes


class NodeLoaded(Message):
    """The selected node's code and logs, and its parent's code for a diff."""

    def __init__(self, detail: NodeDetail, parent: Candidate | None) -> None:
        super().__init__()
        self.detail = detail
        self.parent = parent
