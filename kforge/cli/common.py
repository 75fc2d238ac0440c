"""What the CLI's commands share: the --db option, opening the store, and printing."""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from rich.console import Console

from kforge.store.config import db_path
from kforge.store import Store

T = TypeVar("T")

# Piped output is not folded to 80 columns: tables stay one row per line for grep and less.
# Markup is off: op signatures like "bf16[8,4096]" and "[llm]" must print as they are.
out = Console(highlight=False, markup=False, soft_wrap=True,
              width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True, highlight=False, markup=False, soft_wrap=True)


def add_db_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", metavar="PATH",
                        help="session database (default: $KFORGE_DB or the user data folder)")


def resolve_db(args: argparse.Namespace) -> Path:
    return db_path(getattr(args, "db", None))


def with_store(args: argparse.Namespace, work: Callable[[Store], Awaitable[T]], *,
               create: bool = False) -> T:
    """Open the database (never creating it unless ``create``), run ``work``, close it."""

    async def go() -> T:
        store = await Store.open(resolve_db(args), create=create)
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(go())


def count_or_zero(text: str) -> int:
    """argparse type: a whole number, zero allowed."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, not {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must not be negative")
    return value


def count(text: str) -> int:
    """argparse type: a whole number of at least 1."""
    if count_or_zero(text) < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return int(text)


def session_id(text: str) -> int:
    """argparse type for a session id."""
    try:
        return count(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"a session is named by its number (1 or more), "
                                         f"not {text!r}") from None


def is_tty() -> bool:
    return sys.stderr.isatty()
