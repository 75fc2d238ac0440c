"""Attach to a session and follow it: read a snapshot, then tail the store's event log and fetch
only what the events name. Runs in a worker and reports through messages. Polls only while its
screen is in sight (``poll_wait``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from textual.message import Message
from textual.screen import Screen

from kforge.errors import KforgeError
from kforge.store import SessionStatus, Store
from kforge.store.commands import is_alive
from kforge.store.events import (
    CardsAdded,
    CardUpdated,
    CommandDone,
    EngineAttached,
    Event,
    LogLine,
    ModelMeasured,
    NodeAdded,
    NodeDeleted,
    NodeFinished,
    NodePruned,
    NodeUpdated,
    SessionDeleted,
    SessionSettingsChanged,
    SessionStatusChanged,
    UnknownEvent,
)
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
    measured: ModelMeasured | None = None  # the latest whole-model measurement among them
    ended: tuple[str, str] | None = None  # the search ended: its status, and why ("": unsaid)
    said: str = ""  # the log's last line, after these events


# The statuses a search ends in; a viewer says why it ended.
ENDED = frozenset({SessionStatus.DONE, SessionStatus.STOPPED, SessionStatus.FAILED})


def fold(events: list[Event], said: str = "") -> Interest:
    """Reduce events to the reads that bring a viewer up to date (pure); ``said`` is the log's
    last line before them (a search that is done logs why, then ends: maybe a poll apart)."""
    got = Interest()
    for event in events:
        match event.record:
            case (NodeAdded(node_id=node) | NodeUpdated(node_id=node) | NodePruned(node_id=node)
                  | NodeFinished(node_id=node)):
                got.nodes.add(node)
                got.deleted.discard(node)
                if isinstance(event.record, NodeFinished):
                    got.state = True  # the card's spent and best change with it
            case NodeDeleted(node_id=node):
                got.deleted.add(node)
                got.nodes.discard(node)
            case LogLine() as line:
                got.log.append(log_line(event.at, line))
                said = line.message
            case CommandDone(result=result):
                got.results.append(result)
            case SessionDeleted():
                got.gone = True
            case ModelMeasured() as measured:
                got.measured = measured
                got.state = True
            case SessionStatusChanged(status=status, error=error):
                got.state = True
                why = error or (said if status == SessionStatus.DONE else "")
                got.ended = (status, why) if status in ENDED else None
            case SessionSettingsChanged() | CardsAdded() | CardUpdated() | EngineAttached():
                got.state = True
            case UnknownEvent():
                got.state = True  # written by a newer kforge: re-reading the state is always safe
    got.said = said
    return got


def log_line(at: float, line: LogLine) -> str:
    stamp = time.strftime("%H:%M:%S", time.localtime(at))
    mark = "" if line.level == "info" else f"{line.level.upper()}: "
    return f"{stamp} {mark}{line.message}"


async def read_state(store: Store, session_id: int,
                     measured: ModelMeasured | None = None) -> SessionState:
    """The session and its cards as they stand; ``measured`` as the log last said (the
    snapshot reads it, events bring the later ones)."""
    session = await store.get_session(session_id)
    return SessionState(session, await store.list_cards(session_id), is_alive(session),
                        measured)


async def log_tail(store: Store, session_id: int, upto: int) -> list[str]:
    """The last LOG_TAIL log lines of a session, up to event ``upto``."""
    return [log_line(e.at, e.record) for e in await store.recent_logs(session_id, LOG_TAIL, upto)
            if isinstance(e.record, LogLine)]


def in_sight(screen: Screen) -> bool:
    """Whether any of ``screen`` shows: it is on the app's stack with nothing opaque above it
    (a dialog lets the screen under it show through; a full screen does not)."""
    stack = screen.app.screen_stack
    if screen not in stack:
        return False
    return all(above.styles.background.a < 1 for above in stack[stack.index(screen) + 1:])


async def poll_wait(screen: Screen, poll_s: float) -> None:
    """Wait one poll interval, and on for as long as ``screen`` is out of sight under another:
    a hidden screen reads nothing and repaints nothing, and catches up once it shows again."""
    await asyncio.sleep(poll_s)
    while not in_sight(screen):
        await asyncio.sleep(poll_s)


async def follow_session(store: Store, session_id: int, post: Callable[[Message], object],
                         wait: Callable[[], Awaitable[object]]) -> None:
    """Post a snapshot, then the changes after it, until cancelled or the session is gone;
    ``wait`` paces the polls (``poll_wait``)."""
    seq = await store.last_seq()  # read first: anything later is replayed, never missed
    latest = await store.latest_model_measurement(session_id)
    state = await read_state(store, session_id, latest.record if latest else None)
    post(SessionSnapshot(state, await store.list_nodes(session_id),
                         await log_tail(store, session_id, seq)))
    alive_at = time.monotonic()
    said = ""  # the log's last line seen while following
    while True:
        await wait()
        try:
            events = await store.events_since(seq, session_id)
            changes = Changes()
            if events:
                seq = events[-1].seq
                got = fold(events, said)
                said = got.said
                if got.gone:
                    post(SessionChanged(Changes(gone=True)))
                    return
                changes = Changes(nodes=await store.get_nodes(got.nodes),
                                  deleted=sorted(got.deleted), log=got.log, results=got.results,
                                  ended=got.ended)
                if got.state:
                    changes.state = await read_state(store, session_id,
                                                     got.measured or state.measured)
                    alive_at = time.monotonic()
            if changes.state is None and time.monotonic() - alive_at > ALIVE_CHECK_S:
                alive_at = time.monotonic()
                fresh = await read_state(store, session_id, state.measured)
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
