"""Viewer commands to a session's search (pause, resume, stop, prune, unprune, focus): the one place
that checks them and decides who carries each out. The running engine does, through the store's
command queue; with no engine, the store is written directly where that is safe (pruning, focus:
the next engine reads them from there), and a stop marks an engine that died as stopped. The CLI,
the TUI and the engine all go through here."""

from __future__ import annotations

from enum import StrEnum

from kforge.errors import KforgeError
from kforge.store.lease import engine_alive
from kforge.store.records import CommandKind, Session, SessionStatus
from kforge.store.store import Store

NODE_KINDS = frozenset({CommandKind.PRUNE, CommandKind.UNPRUNE})
# What the store carries out without an engine: the next engine reads it from there.
STORE_KINDS = NODE_KINDS | {CommandKind.FOCUS}
# Statuses only an engine sets and releases: found with no live engine, the engine died.
HELD_STATUSES = frozenset({SessionStatus.RUNNING, SessionStatus.PAUSED})


class Route(StrEnum):
    ENGINE = "engine"  # queue it for the running engine
    DIRECT = "direct"  # write the store; the next engine reads it from there
    RELEASE = "release"  # a stop whose engine died: mark the session stopped
    NO_ENGINE = "no engine"  # only a running search can do this


class BadCommand(KforgeError):
    """A command kind or argument that no search accepts."""


class NoRunningSearch(KforgeError):
    """Pause, resume or stop asked of a session that no engine is searching."""


def route(kind: CommandKind, alive: bool, status: str) -> Route:
    """Who carries out ``kind`` for a session in ``status`` whose engine is ``alive`` or not."""
    if alive:
        return Route.ENGINE
    if kind in STORE_KINDS:
        return Route.DIRECT
    if kind is CommandKind.STOP and status in HELD_STATUSES:
        return Route.RELEASE
    return Route.NO_ENGINE


def checked(kind: str, arg: object = None) -> tuple[CommandKind, int | None]:
    """The command as a search reads it: prune and unprune name a node, focus names a card or
    nothing (to clear it), the others take no argument. BadCommand says what is wrong."""
    try:
        known = CommandKind(kind)
    except ValueError:
        raise BadCommand(f"unknown command {kind!r} (known: {', '.join(CommandKind)})") from None
    if known in NODE_KINDS and not _is_id(arg):
        raise BadCommand(f"{known} needs a node id (a whole number, 1 or more), not {arg!r}")
    if known is CommandKind.FOCUS and arg is not None and not _is_id(arg):
        raise BadCommand(f"focus needs a card id (a whole number, 1 or more) or nothing to "
                         f"clear it, not {arg!r}")
    if known not in STORE_KINDS and arg is not None:
        raise BadCommand(f"{known} takes no argument, not {arg!r}")
    return known, arg if isinstance(arg, int) else None


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def asked(kind: CommandKind, arg: int | None, op: str = "") -> str:
    """What a command asks for, as the words after "to": ``prune node 7``, ``focus on _softmax
    8x1024`` (a focus names its op, ``op``: the card's ``label``)."""
    if kind in NODE_KINDS:
        return f"{kind} node {arg}"
    if kind is CommandKind.FOCUS:
        return "clear its focus" if arg is None else f"focus on {op}"
    return str(kind)


def is_alive(session: Session) -> bool:
    """Whether an engine is searching the session right now: on this host its process still
    runs (however late its heartbeat); on another host its heartbeat is fresh."""
    return engine_alive(session.engine_pid, session.engine_host, session.heartbeat_at)


ENGINE_GONE = "engine gone"


def shown_status(session: Session) -> str:
    """The session's status as a viewer shows it: one only an engine holds (running, paused)
    whose engine is gone (killed, or silent past its lease on another host) is "engine gone"
    (`kforge stop` marks it stopped, `kforge resume` continues it)."""
    if session.status in HELD_STATUSES and not is_alive(session):
        return ENGINE_GONE
    return session.status


async def issue(store: Store, session_id: int, kind: str, arg: object = None) -> str:
    """Check one command against the session and carry it out; say what happened in a short
    sentence. BadCommand for a node or card not in the session, NoRunningSearch for what only a
    running search can do."""
    kind, arg = checked(kind, arg)
    session = await store.get_session(session_id)
    op = await _check_target(store, session_id, kind, arg)
    how = route(kind, is_alive(session), session.status)
    if how is Route.ENGINE:
        await store.send_command(session_id, kind, arg)
        return (f"asked the engine of session {session_id} (process {session.engine_pid}) "
                f"to {asked(kind, arg, op)}")
    if how is Route.RELEASE:
        await store.release_engine(session_id, SessionStatus.STOPPED,
                                   "the engine had died; marked stopped")
        return f"session {session_id} had no live engine; marked stopped"
    if how is Route.NO_ENGINE:
        raise NoRunningSearch(f"no search is running for session {session_id} "
                              f"(status: {session.status})")
    if kind is CommandKind.FOCUS:
        said = await save_focus(store, session_id, arg)
        return f"{said}; the search takes it up when it resumes"
    assert arg is not None  # checked: prune and unprune name a node
    return await save_pruned(store, arg, kind is CommandKind.PRUNE)


async def _check_target(store: Store, session_id: int, kind: CommandKind, arg: int | None
                        ) -> str:
    """A node or card named by a command must belong to the session; a focused card's op as
    messages name it ("" for any other command)."""
    if kind in NODE_KINDS:
        found = await store.get_nodes([arg])
        if not found or found[0].session_id != session_id:
            raise BadCommand(f"no search node {arg} in session {session_id}")
    elif kind is CommandKind.FOCUS and arg is not None:
        card = next((row for row in await store.list_cards(session_id) if row.id == arg), None)
        if card is None:
            raise BadCommand(f"no op card {arg} in session {session_id}")
        return card.card.label
    return ""


async def save_focus(store: Store, session_id: int, card_id: int | None) -> str:
    """Store the card the search is restricted to (None: every op) with the session's search
    settings, where a resumed engine reads it; say so, naming the op as the op list shows it."""
    session = await store.get_session(session_id)
    search = {**session.settings.get("search", {}), "focus": card_id}
    await store.update_settings(session_id, {"search": search})
    if card_id is None:
        return "focus cleared"
    return f"focused on {(await store.get_card(card_id)).card.label}"


async def save_pruned(store: Store, node_id: int, pruned: bool) -> str:
    """Mark a node's subtree as out of the search, or back in."""
    await store.set_pruned(node_id, pruned)
    return f"{'pruned' if pruned else 'unpruned'} node {node_id}"
