"""Persistent state, beside ``capture`` above ``runtime``: the session store (one SQLite file per
workspace, ``store.Store``: its queries, over ``lease``, the engine lease, over ``connection``, how
the database opens, reads and writes, with the secrets and durability its caller gives), its
closed set of typed events (``events``), the commands TUI, CLI and engine send a search
(``commands``), and where kforge keeps its files and reads the user's config (``config``)."""

from kforge.store.records import CardStatus, CommandKind, NodeStatus, SessionStatus
from kforge.store.store import Store

__all__ = ["CardStatus", "CommandKind", "NodeStatus", "SessionStatus", "Store"]
