"""What the TUI's search commands do: through the engine when one is alive, else on the store
directly where that is safe (pruning, focus), else a clear word that no search is running."""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from kforge.errors import KforgeError
from kforge.store import CommandKind, Store
from kforge.store.records import Session
from kforge.store.store import engine_alive


class Route(StrEnum):
    ENGINE = "engine"  # queue it for the running engine
    DIRECT = "direct"  # write the store; the next engine reads it from there
    NO_ENGINE = "no engine"  # only a running search can do this


class NoRunningSearch(KforgeError):
    """Pause, resume or stop were asked of a session that no engine is searching."""


def route(kind: CommandKind, alive: bool) -> Route:
    if alive:
        return Route.ENGINE
    if kind in (CommandKind.PRUNE, CommandKind.UNPRUNE, CommandKind.FOCUS):
        return Route.DIRECT
    return Route.NO_ENGINE


def is_alive(session: Session) -> bool:
    return engine_alive(session.engine_pid, session.engine_host, session.heartbeat_at)


async def control(store: Store, session_id: int, kind: CommandKind, arg: Any = None) -> str:
    """Carry out one command and say what happened, in a short sentence."""
    session = await store.get_session(session_id)
    how = route(kind, is_alive(session))
    if how is Route.ENGINE:
        await store.send_command(session_id, kind, arg)
        return f"{kind} sent to the search"
    if how is Route.NO_ENGINE:
        raise NoRunningSearch(f"no search is running for session {session_id} "
                              f"(status: {session.status}): press r to resume it")
    if kind is CommandKind.FOCUS:
        search = {**session.settings.get("search", {}), "focus": arg}
        await store.update_settings(session_id, {"search": search})
        return ("focus cleared" if arg is None else f"the search will focus on card {arg} "
                "when it resumes")
    await store.set_pruned(int(arg), kind is CommandKind.PRUNE)
    return f"{'pruned' if kind is CommandKind.PRUNE else 'unpruned'} node {arg}"
