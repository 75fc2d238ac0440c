"""The session store: one SQLite file per workspace (see ``store.Store``)."""

from kforge.store.records import CardStatus, CommandKind, NodeStatus, SessionStatus
from kforge.store.store import Store

__all__ = ["CardStatus", "CommandKind", "NodeStatus", "SessionStatus", "Store"]
