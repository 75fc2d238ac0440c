"""What the CLI's commands share: the --db and --json options, opening the store, and printing."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
from collections.abc import Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from rich.console import Console
from rich.segment import Segment

from kforge.app.database import with_store as app_with_store
from kforge.core.inert import capped, inert
from kforge.core.settings import SettingsError, parse_duration
from kforge.store import Store
from kforge.store.config import db_path
from kforge.store.records import MAX_ROW_ID

T = TypeVar("T")
# How much of one stored text a view prints (``kforge.core.inert.capped``): a table's cell, a
# line of its own, a block such as a kernel's source or a prompt.
CELL_CHARS, LINE_CHARS, TEXT_CHARS = 200, 2_000, 100_000
# Where an op's eager time comes from (``CardRow.eager_source``), as the CLI names it: the
# evaluator's device time of the op alone, or the profile's time per call in the model run.
EAGER_SOURCES = {"eval": "device", "prof": "profile"}

class InertConsole(Console):
    """A console whose every piece of text is made ``inert`` as it is written (rich's own
    styling codes are added afterwards): database text, whatever it holds, cannot drive the
    terminal from any table, line or message."""

    def on_broken_pipe(self) -> None:
        """The reader of the output left (`kforge show 1 | head -1`): print nothing more, and end
        as the command ends on any broken pipe (rich's own way is a bare sys.exit(1))."""
        self.quiet = True
        raise BrokenPipeError

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control else Segment(inert(segment.text), segment.style)
            for segment in buffer)


# Piped output is not folded to 80 columns: tables stay one row per line for grep and less.
# Markup is off: op signatures like "bf16[8,4096]" and "[llm]" must print as they are.
out = InertConsole(highlight=False, markup=False, soft_wrap=True,
                   width=None if sys.stdout.isatty() else 200)
err = InertConsole(stderr=True, highlight=False, markup=False, soft_wrap=True)


def cells(*texts: str) -> tuple[str, ...]:
    """Stored texts as a table's cells (or a header line) show them: each cut to
    ``CELL_CHARS``."""
    return tuple(capped(text, CELL_CHARS) for text in texts)


def add_db_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", metavar="PATH",
                        help="session database (default: $KFORGE_DB or the user data folder)")


def resolve_db(args: argparse.Namespace) -> Path:
    return db_path(getattr(args, "db", None))


def with_store(args: argparse.Namespace, work: Callable[[Store], Awaitable[T]], *,
               create: bool = False, reads_only: bool = False) -> T:
    """Open the database --db names (``kforge.app.database.with_store``), run ``work``, close
    it."""
    return app_with_store(resolve_db(args), work, create=create, reads_only=reads_only)


def add_trust_plugins_option(parser: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    parser.add_argument("--trust-plugins", action="store_true",
                        help="import the module:factory proposer or evaluator, and use the "
                             "Ray cluster, the session's database names (without this, give "
                             "it again with --proposer, --evaluator or --cluster)")


def add_json_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object on stdout (the session, its model, status "
                             "and op cards, ...) and nothing else; progress and the human "
                             "report go to stderr")


def respond(args: argparse.Namespace, work: Callable[[], tuple[int, dict]]) -> int:
    """Run a command that can answer in JSON: ``work`` prints its human report and returns its
    exit code and its facts. With --json, what it prints goes to stderr and its facts, as one
    JSON object, are all that reaches stdout."""
    if not getattr(args, "json", False):
        return work()[0]
    with _stdout_to_stderr():
        code, facts = work()
    print(json.dumps(facts), flush=True)
    return code


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """Send what is written to stdout meanwhile to stderr, at the file descriptor too: native
    code (CUDA, a model's own libraries) writes there without going through ``sys.stdout``."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        for stream in (sys.stdout, sys.stderr):  # what was held for fd 1 lands on stderr too
            stream.flush()
        os.dup2(saved, 1)
        os.close(saved)


def whole(least: int, most: int) -> Callable[[str], int]:
    """argparse type: a whole number from ``least`` to ``most``; anything else is refused with
    the range stated."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or not least <= value <= most:
            raise argparse.ArgumentTypeError(f"must be a whole number from {least:,} to "
                                             f"{most:,}, not {text!r}")
        return value

    return parse


def number(least: float, most: float) -> Callable[[str], float]:
    """argparse type: a finite number from ``least`` to ``most``, the range stated otherwise."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not least <= value <= most:  # nan is never in range
            raise argparse.ArgumentTypeError(f"must be a number from {least:,} to {most:,}, "
                                             f"not {text!r}")
        return value

    return parse


def duration(most_s: float) -> Callable[[str], float]:
    """argparse type: a duration (``90s``, ``15m``, ``2h``) above 0 and at most ``most_s``, in
    seconds."""
    def parse(text: str) -> float:
        try:
            seconds = parse_duration(text)
        except SettingsError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if not 0 < seconds <= most_s:
            raise argparse.ArgumentTypeError(f"must be a duration above 0 s and at most "
                                             f"{most_s / 86400:,.0f} days (e.g. 90s, 15m or 2h), "
                                             f"not {text!r}")
        return seconds

    return parse


row_id = whole(1, MAX_ROW_ID)  # the number of a stored node or op card


def session_id(text: str) -> int:
    """argparse type for a session id."""
    try:
        return row_id(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"a session is named by its number (1 to "
                                         f"{MAX_ROW_ID}), not {text!r}") from None


def is_tty() -> bool:
    return sys.stderr.isatty()
