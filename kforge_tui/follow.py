"""Attach to a session and follow it: read a snapshot, then tail the store's event log and fetch
only what the events name. Runs in a worker and reports through messages."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from textual.message import Message

from kforge.errors import KforgeError
from kforge.store import Store
from kforge.store.records import Event
from kforge_tui.control import is_alive
from kforge_tui.messages import (
    Changes,
    ErrorRaised,
    SessionChanged,
    SessionSnapshot,
    SessionState,
)

LOG_TAIL = 500  # session log lines kept on screen
ALIVE_CHECK_S = 2.0  # how often the engine's heartbeat is looked at without an event


@dataclass
class Interest:
    """What a batch of events asks the viewer to re-read."""

    nodes: set[int] = field(default_factory=set)
    deleted: set[int] = field(default_factory=set)
    state: bool = False
    log: list[str] = field(default_factory=list)
    results: list[str] = field(default_factory=list)
    gone: bool = False


def fold(events: list[Event]) -> Interest:
    """Reduce events to the reads that bring a viewer up to date (pure)."""
    got = Interest()
    for e in events:
        kind, data = e.kind, e.data
        if kind in ("node_added", "node_updated", "node_finished", "node_pruned"):
            got.nodes.add(data["node_id"])
            got.deleted.discard(data["node_id"])
            if kind == "node_finished":
                got.state = True  # the card's spent and best change with it
        elif kind == "node_deleted":
            got.deleted.add(data["node_id"])
            got.nodes.discard(data["node_id"])
        elif kind == "log":
            got.log.append(log_line(e))
        elif kind == "command_done":
            got.results.append(str(data.get("result", "")))
        elif kind == "session_deleted":
            got.gone = True
        elif kind in ("session_status", "session_settings", "cards_added", "card_updated",
                      "engine_attached"):
            got.state = True
    return got


def log_line(event: Event) -> str:
    level = event.data.get("level", "info")
    stamp = time.strftime("%H:%M:%S", time.localtime(event.at))
    mark = "" if level == "info" else f"{level.upper()}: "
    return f"{stamp} {mark}{event.data.get('message', '')}"


async def read_state(store: Store, session_id: int) -> SessionState:
    session = await store.get_session(session_id)
    return SessionState(session, await store.list_cards(session_id), is_alive(session))


async def log_tail(store: Store, session_id: int, upto: int) -> list[str]:
    """The last LOG_TAIL log lines of a session, up to event ``upto``."""
    return [log_line(e) for e in await store.recent_logs(session_id, LOG_TAIL, upto)]


async def follow_session(store: Store, session_id: int, post: Callable[[Message], object],
                         poll_s: float) -> None:
    """Post a snapshot, then the changes after it, until cancelled or the session is gone."""
    seq = await store.last_seq()  # read first: anything later is replayed, never missed
    state = await read_state(store, session_id)
    post(SessionSnapshot(state, await store.list_nodes(session_id),
                         await log_tail(store, session_id, seq)))
    alive_at = time.monotonic()
    while True:
        await asyncio.sleep(poll_s)
        try:
            events = await store.events_since(seq, session_id)
            changes = Changes()
            if events:
                seq = events[-1].seq
                got = fold(events)
                if got.gone:
                    post(SessionChanged(Changes(gone=True)))
                    return
                changes = Changes(nodes=await store.get_nodes(got.nodes),
                                  deleted=sorted(got.deleted), log=got.log, results=got.results)
                if got.state:
                    changes.state = await read_state(store, session_id)
                    alive_at = time.monotonic()
            if changes.state is None and time.monotonic() - alive_at > ALIVE_CHECK_S:
                alive_at = time.monotonic()
                fresh = await read_state(store, session_id)
                if fresh.alive != state.alive:
                    changes.state = fresh
            if changes.state is not None:
                state = changes.state
            if events or changes.state is not None:
                post(SessionChanged(changes))
        except KforgeError as exc:
            if "no session" in str(exc):
                post(SessionChanged(Changes(gone=True)))
                return
            post(ErrorRaised(str(exc)))  # a locked database: say so, try again next tick
