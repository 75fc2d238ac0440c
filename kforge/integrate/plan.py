"""Read a session's integration plan from the store: every card with its best kernel's fate."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kforge.integrate.winners import (
    NO_GPU_ARCH,
    CardChoice,
    best_nodes,
    decide,
    projected_speedup,
    worth_routing,
)
from kforge.store import Store
from kforge.store.config import store_options
from kforge.store.records import Session

T = TypeVar("T")


@dataclass(frozen=True)
class SessionPlan:
    session: Session
    decisions: list[CardChoice]

    @property
    def made_on(self) -> str:
        return str(self.session.gpu.get("arch") or NO_GPU_ARCH)

    @property
    def winners(self) -> list[CardChoice]:
        return [d for d in self.decisions if d.replaced]

    @property
    def projected(self) -> float:
        return projected_speedup(self.decisions)


async def load_plan(store: Store, session_id: int, runs_on: str | None = None,
                    graphs: bool = True) -> SessionPlan:
    """The session's cards and what becomes of each on a GPU of architecture ``runs_on``
    (None: any, as for an export). Without ``graphs`` (the model runs eagerly, not replayed as
    CUDA graphs) only the kernels worth their guard's CPU cost are kept (``worth_routing``)."""
    session = await store.get_session(session_id)
    rows = await store.list_cards(session_id)
    best = best_nodes(await store.list_nodes(session_id))
    arch = str(session.gpu.get("arch") or NO_GPU_ARCH)
    decisions = []
    for row in rows:
        node = best.get(row.id)
        detail = await store.get_node(node.id) if node is not None else None
        decisions.append(decide(row, detail, made_on=arch, runs_on=runs_on))
    return SessionPlan(session, decisions if graphs else worth_routing(decisions))


def read_plan(db: Path, session_id: int, runs_on: str | None = None,
              graphs: bool = True) -> SessionPlan:
    """``load_plan`` from the database file at ``db`` (which must exist), from plain code."""

    async def go() -> SessionPlan:
        store = await Store.open(db, create=False, options=store_options())
        try:
            return await load_plan(store, session_id, runs_on, graphs)
        finally:
            await store.close()

    return run_sync(go())


def run_sync(work: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from synchronous code, also where an event loop already
    runs in this thread (a notebook): then in a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(work)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, work).result()
