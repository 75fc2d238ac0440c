"""A session's facts as a program reads them: the answer every ``--json`` command about a
session starts with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kforge.app.database import with_store
from kforge.store import Store
from kforge.store.commands import shown_status


@dataclass(frozen=True)
class SessionFacts:
    """A session as it stands: its model, status (as ``kforge sessions`` shows it), error, op
    cards and targets, best speedup, spend, and the nodes still being confirmed."""

    session: int
    model: str
    status: str
    error: str | None
    cards: int
    targets: int
    best_speedup: float | None
    usd_spent: float
    confirming: tuple[int, ...]

    def to_dict(self) -> dict:
        return {"session": self.session, "model": self.model, "status": self.status,
                "error": self.error, "cards": self.cards, "targets": self.targets,
                "best_speedup": self.best_speedup,
                # eager's device time over the kernel's (docs/evaluation.md)
                "speedup_of": "device_us",
                "usd_spent": self.usd_spent, "confirming": list(self.confirming)}


async def facts_of(store: Store, session_id: int) -> SessionFacts:
    """The facts of session ``session_id`` in ``store``."""
    session = await store.get_session(session_id)
    cards = await store.list_cards(session_id)
    speedups = [row.best_speedup for row in cards if row.best_speedup is not None]
    confirming = tuple(n.id for n in await store.list_nodes(session_id) if n.confirming)
    return SessionFacts(session=session.id, model=session.model, status=shown_status(session),
                        error=session.error or None, cards=len(cards),
                        targets=sum(row.card.target for row in cards),
                        best_speedup=max(speedups, default=None),
                        usd_spent=session.usd_spent, confirming=confirming)


def session_facts(db: Path, session_id: int) -> SessionFacts:
    """The facts of session ``session_id`` in the database at ``db``."""
    return with_store(db, lambda store: facts_of(store, session_id))
