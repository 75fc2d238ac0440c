"""Opening the session database for one piece of work: never created unless asked, and read-only
for work that only reads where the file or its folder may not be written."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from kforge.store import Store
from kforge.store.config import store_options

T = TypeVar("T")


async def open_store(path: Path, *, create: bool = False, reads_only: bool = False) -> Store:
    """The store at ``path``; for work that ``reads_only``, opened read-only where the file or
    its folder may not be written, so a database in a read-only place can still be browsed."""
    if reads_only:
        return await Store.open_to_browse(path, options=store_options())
    return await Store.open(path, create=create, options=store_options())


def with_store(path: Path, work: Callable[[Store], Awaitable[T]], *, create: bool = False,
               reads_only: bool = False) -> T:
    """Open the database at ``path`` (as ``open_store``), run ``work`` on it, close it."""

    async def go() -> T:
        store = await open_store(path, create=create, reads_only=reads_only)
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(go())
