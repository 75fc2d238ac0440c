"""A connection to one kforge database: the ways it opens, and how it reads and writes.

A database holds data only: it opens only when its schema is exactly kforge's for its version
(``check_schema``), before anything else is read or written, so no trigger, view, virtual table or
generated column of anyone else's runs as kforge reads or writes it (a trigger in a crafted
database rewrote what kforge had just checked, such as the plug-ins a session names, as kforge
saved it; a view over an endless recursive query hung every reader). Every read is bounded in
rows (a list the database could make as long as it likes ends with one line saying so) and in
time (``READ_LIMIT_S``). The three ways to open (``open``, ``open_to_browse``,
``open_read_only``) share their checks of the files beside it.

What it keeps out and how durably it writes are its caller's (``StoreOptions``): every text it
stores is redacted of the caller's secrets, and ``full`` durability (SQLite ``synchronous =
FULL``) makes every committed transaction (a finished evaluation, its cost) survive a power
loss, at the price of one fsync per commit. A write that finds the database locked by another
process fails fast, or, for a patient store, waits it out with backoff.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiosqlite

from kforge.core.schema import check, checked
from kforge.core.secrets import redact, redact_values
from kforge.core.settings import DURABILITY
from kforge.errors import KforgeError
from kforge.store.beside import check_database_files
from kforge.store.events import EventRecord, to_row
from kforge.store.records import dumps
from kforge.store.schema import LATEST, MIGRATIONS, SchemaObject, normalized, schema_objects

log = logging.getLogger("kforge.store")

# SQLite's durability level. FULL: a commit is on disk before it returns, so no finished result
# is lost on power loss (NORMAL, with WAL, may lose the last commits).
SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL"}
LOCK_BACKOFF_S = (0.05, 1.0)  # first and longest pause between waits for another's write lock
# What the SQLite driver raises for a database it cannot use: its own errors, and the
# UnicodeDecodeError it raises where SQLite's error message (quoting a damaged schema) is not UTF-8.
DB_ERRORS = (sqlite3.Error, UnicodeDecodeError)
# The longest one read may take: a read that runs longer is stopped with one line.
READ_LIMIT_S = 30.0
PROGRESS_STEPS = 10_000  # SQLite instructions between two looks at the clock

C = TypeVar("C", bound="Connection")


@dataclass(frozen=True)
class StoreOptions:
    """What the caller decides of how a store writes: the secrets it keeps out of everything it
    stores, and its durability (``[store] durability``: ``full`` or ``normal``)."""

    secrets: tuple[str, ...] = ()
    durability: str = checked("full", choices=DURABILITY)

    def __post_init__(self) -> None:
        check(self)


class Own(str):
    """Text that names kforge's own things (an op, a card key, a model's path, an op card's
    arguments as JSON, an event's kind): stored as it is, never passed through redaction,
    which would rewrite it wherever a secret happened to match part of it."""


class Redacting:
    """A connection whose statements never carry a secret: every text parameter but ``Own``
    text is redacted (``kforge.core.secrets.redact``) on its way in, whichever table it is for
    (compile logs, sanitizer reports, crash output, LLM calls, log lines); JSON is written by
    ``json``, which redacts its text values and never its keys."""

    def __init__(self, db: aiosqlite.Connection, secrets: tuple[str, ...]) -> None:
        object.__setattr__(self, "_conn", db)
        object.__setattr__(self, "_secrets", secrets)

    def execute(self, sql: str, parameters: Iterable[Any] | Mapping[str, Any] = ()) -> Any:
        return self._conn.execute(sql, self._clean(parameters))

    def execute_fetchall(self, sql: str,
                         parameters: Iterable[Any] | Mapping[str, Any] = ()) -> Any:
        return self._conn.execute_fetchall(sql, self._clean(parameters))

    def _clean(self, parameters: Iterable[Any] | Mapping[str, Any]) -> Any:
        if not self._secrets:
            return parameters

        def one(value: Any) -> Any:
            if isinstance(value, Own):
                return str(value)
            return redact(value, self._secrets) if isinstance(value, str) else value

        if isinstance(parameters, Mapping):  # named parameters
            return {name: one(value) for name, value in parameters.items()}
        return tuple(one(value) for value in parameters)

    def json(self, value: Any) -> Own:
        """``value`` as stored JSON: its text values redacted, its keys (kforge's own field
        names) as they are."""
        return Own(dumps(redact_values(value, self._secrets) if self._secrets else value))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._conn, name, value)


class Connection:
    """Async access to one kforge database file. Open with ``await Store.open(path)``."""

    def __init__(self, db: aiosqlite.Connection, path: Path, options: StoreOptions) -> None:
        self._db = Redacting(db, options.secrets)
        self.path = path
        self.options = options
        self._clock = _Deadline()  # when the read under way is stopped
        self._lock = asyncio.Lock()
        self.read_only = False  # opened by open_read_only: every write fails

    # ----- opening -----

    @classmethod
    async def open(cls: type[C], path: Path | str, *, create: bool = True,
                   timeout_s: float = 5.0, options: StoreOptions = StoreOptions()) -> C:
        """Open (and if needed create and migrate) the database at ``path``.

        With ``create=False`` a missing file is an error instead of a new database, so read-only
        commands change nothing on disk.
        """
        path = _checked_path(path, create=create)
        wal = path.with_name(path.name + "-wal")
        if not create and path.stat().st_size == 0 and not (wal.exists() and wal.stat().st_size):
            # SQLite would make it a database
            raise KforgeError(f"{path} is an empty file, not a kforge database (a profile makes "
                              "one: `kforge profile MODEL --db FILE`)")
        if not path.exists():
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise KforgeError(f"cannot create the database folder {path.parent}: "
                                  f"{exc.strerror}") from None
        # Checked here: a connection that fails inside aiosqlite's thread leaves a traceback.
        if path.exists() and not os.access(path, os.R_OK | os.W_OK):
            raise KforgeError(f"cannot open database {path} for writing: no permission (a "
                              "read-only database can be browsed with `kforge sessions` and "
                              "`kforge show`)")
        if not path.exists() and not os.access(path.parent, os.W_OK):
            raise KforgeError(f"cannot create a database in {path.parent}: no permission to "
                              "write there")
        db = await _connect(path, path, timeout_s)
        return await cls._opened(db, path, options, cls._setup, timeout_s)

    @classmethod
    async def open_to_browse(cls: type[C], path: Path | str, *,
                             options: StoreOptions = StoreOptions()) -> C:
        """An existing database for a viewer: read-only where this process may not write the
        file or its folder (a write then fails with one line), else as ``open`` opens it."""
        path = Path(path)
        if path.exists() and not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)):
            return await cls.open_read_only(path, options=options)
        return await cls.open(path, create=False, options=options)

    @classmethod
    async def open_read_only(cls: type[C], path: Path | str, *, timeout_s: float = 5.0,
                             options: StoreOptions = StoreOptions()) -> C:
        """Open an existing database for browsing without writing to it, even where this process
        may not write (a read-only file or folder): nothing on disk changes, and a write fails.
        Where SQLite cannot create the shared-memory file a WAL database needs beside it, the
        file is read as immutable (as it stands, with no locking: nobody can write it there)."""
        path = _checked_path(path, create=False)
        if not os.access(path, os.R_OK):
            raise KforgeError(f"cannot open database {path}: no permission to read it")
        for mode in ("mode=ro", "mode=ro&immutable=1"):
            db = await _connect(path, f"{path.absolute().as_uri()}?{mode}", timeout_s)
            db.row_factory = aiosqlite.Row
            try:
                version = (await (await db.execute("PRAGMA user_version")).fetchone())[0]
                break
            except DB_ERRORS as exc:
                await db.close()
                error = explain(exc, path)
        else:
            raise error
        if version != LATEST:
            await db.close()
            raise KforgeError(f"{path} holds kforge schema {version}, this kforge reads "
                              f"{LATEST}: open it once where it can be written to upgrade it"
                              if version < LATEST else _newer(path, version))

        async def browse(store: Connection, _: float) -> None:
            await store._bound_reads()
            await store._check_schema(version)
            store.read_only = True

        return await cls._opened(db, path, options, browse, timeout_s)

    @classmethod
    async def _opened(cls: type[C], db: aiosqlite.Connection, path: Path,
                      options: StoreOptions, prepare: Any, timeout_s: float) -> C:
        """The store on connection ``db`` once ``prepare`` has checked (and set up) the
        database; the connection closed, and the error one line, where anything fails (a
        connection left open keeps its thread, and the process, alive)."""
        try:
            store = cls(db, path, options)
            await prepare(store, timeout_s)
            check_database_files(path)  # as SQLite left them: what it made is its own
            return store
        except DB_ERRORS as exc:  # a schema SQLite cannot read
            await db.close()
            raise explain(exc, path) from None
        except BaseException:
            await db.close()
            raise

    async def _setup(self, timeout_s: float) -> None:
        db = self._db
        db.row_factory = aiosqlite.Row
        await db.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
        await self._bound_reads()
        version = (await (await db.execute("PRAGMA user_version")).fetchone())[0]
        if version > LATEST:
            raise KforgeError(_newer(self.path, version))
        await self._check_schema(version)
        await db.execute("PRAGMA foreign_keys = ON")
        mode = (await (await db.execute("PRAGMA journal_mode = WAL")).fetchone())[0]
        if mode.lower() != "wal":
            raise KforgeError(f"{self.path} cannot use write-ahead logging (journal mode "
                              f"stays {mode!r}); put the database on a local disk")
        await db.execute(f"PRAGMA synchronous = {SYNCHRONOUS[self.options.durability]}")
        if version < LATEST:
            await self._migrate()

    async def _bound_reads(self) -> None:
        """Have SQLite stop a read that runs past its deadline (``_read``), and run no function
        with side effects that a schema names (defence in depth: ``check_schema`` admits none)."""
        await self._db.execute("PRAGMA trusted_schema = OFF")
        await self._db.set_progress_handler(self._clock.overdue, PROGRESS_STEPS)

    async def _read(self, sql: str, params: Iterable[Any] = (), *, at_most: int | None = None,
                    what: str = "rows") -> list[aiosqlite.Row]:
        """The rows of one read, which SQLite stops after ``READ_LIMIT_S``; with ``at_most``,
        KforgeError (naming ``what``) where there are more."""
        if at_most is not None:
            sql, params = f"{sql} LIMIT ?", (*params, at_most + 1)
        async with self._lock:
            self._clock.at = time.monotonic() + READ_LIMIT_S
            try:
                # one step in the connection's thread: a reader cancelled meanwhile cannot leave a
                # half-read statement open, which would pin the connection to an old snapshot
                rows = list(await self._db.execute_fetchall(sql, tuple(params)))
            except DB_ERRORS as exc:
                if self._clock.overdue():
                    raise KforgeError(f"reading {self.path} took longer than {READ_LIMIT_S:.0f} "
                                      "s, and was stopped: the database is too large for this "
                                      "read, or damaged") from None
                raise explain(exc, self.path) from None
            finally:
                self._clock.at = None
        if at_most is not None and len(rows) > at_most:
            raise KforgeError(f"{self.path} holds more than {at_most:,} {what}, more than kforge "
                              "reads at once: it was not made by kforge, or is damaged")
        return rows

    async def _check_schema(self, version: int) -> None:
        """Refuse the database unless its schema objects are exactly those kforge's migrations
        create for ``version``, compared by type, name and SQL (``kforge.store.schema``)."""
        expected = schema_objects(version)
        rows = await self._read("SELECT type, name, sql FROM sqlite_master LIMIT ?",
                                (len(expected) + 1,))  # one more names what is not kforge's
        found = [SchemaObject(str(t).lower(), str(n).lower(),
                              normalized(None if q is None else str(q))) for t, n, q in rows]
        kinds = {o.name: o.kind for o in expected}
        for thing in found:
            if thing in expected:
                continue
            name, kind = repr(thing.name[:80]), kinds.get(thing.name)
            if kind is None:
                what = f"it holds the {thing.kind} {name}, which kforge does not create"
            elif kind != thing.kind:
                what = f"its {name} is a {thing.kind}, where kforge has a {kind}"
            else:
                what = (f"its {kind} {name} is not the one kforge creates (a column, a default "
                        "or a check of its own)")
            raise KforgeError(f"{self.path} is not a kforge database: {what}; SQL of its own "
                              "would run as kforge reads or writes it")
        if missing := sorted(o.name for o in expected - set(found)):
            raise KforgeError(f"{self.path} is not a kforge database of schema {version}: it "
                              f"lacks {', '.join(missing[:3])}")

    async def _migrate(self) -> None:
        async with self.transaction() as db:
            version = (await (await db.execute("PRAGMA user_version")).fetchone())[0]
            for step in range(version, LATEST):
                for statement in MIGRATIONS[step].split(";"):
                    if statement.strip():
                        await db.execute(statement)
            await db.execute(f"PRAGMA user_version = {LATEST}")

    async def close(self) -> None:
        await self._db.close()

    async def __aenter__(self: C) -> C:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @asynccontextmanager
    async def transaction(self, *, patient: bool = False
                          ) -> AsyncIterator[Redacting]:
        """One write transaction (BEGIN IMMEDIATE: it takes the write lock up front), rolled back
        on any error or cancellation. A ``patient`` transaction, and every one of a patient
        store (one that holds an engine lease: ``kforge.store.lease``), waits out another
        process's lock."""
        async with self._lock:
            self._may_write()
            waited_s = await self._begin(patient or self._patient)
            try:
                await self._writing(waited_s)
                yield self._db
            except DB_ERRORS as exc:  # e.g. a write to a database opened read-only
                await self._rollback()
                raise explain(exc, self.path) from None
            except BaseException:
                await self._rollback()
                raise
            try:
                await self._settle("COMMIT")
            except DB_ERRORS as exc:
                await self._rollback()
                raise explain(exc, self.path) from None

    async def _begin(self, patient: bool) -> float:
        """Start the write transaction; return how long it waited for another process's lock
        (only a patient caller waits beyond the connection's busy timeout)."""
        started = time.monotonic()
        pause, first_pause = LOCK_BACKOFF_S[0], True
        while True:
            try:
                await self._settle("BEGIN IMMEDIATE")
                return time.monotonic() - started if not first_pause else 0.0
            except asyncio.CancelledError:
                await self._rollback()  # the BEGIN may have gone through meanwhile
                raise
            except DB_ERRORS as exc:
                if not (patient and is_lock(exc)):
                    raise explain(exc, self.path) from None
            if first_pause or pause == LOCK_BACKOFF_S[1]:
                log.warning("database %s is locked by another process; waiting for it "
                            "(%.0f s so far)", self.path, time.monotonic() - started)
            first_pause = False
            await asyncio.sleep(pause)
            pause = min(pause * 2, LOCK_BACKOFF_S[1])

    async def _settle(self, sql: str) -> None:
        """Run a transaction-control statement to its end even if the caller is cancelled
        meanwhile: the connection's thread runs it either way, and the transaction must know
        the state it leaves. A cancellation that came meanwhile is raised after it."""
        step = asyncio.ensure_future(self._db.execute(sql))
        cancelled = False
        while not step.done():
            try:
                await asyncio.wait([step])
            except asyncio.CancelledError:
                cancelled = True
        if cancelled:
            if not step.cancelled():
                step.exception()  # the statement's own error yields to the cancellation
            raise asyncio.CancelledError
        step.result()

    async def _rollback(self) -> None:
        if self._db.in_transaction:
            await self._settle("ROLLBACK")

    # what a store that holds an engine lease adds to each write (``kforge.store.lease``)

    @property
    def _patient(self) -> bool:
        """Whether every write waits out another process's lock."""
        return False

    def _may_write(self) -> None:
        """Refuse a write before it begins (a lease found lost)."""

    async def _writing(self, waited_s: float) -> None:
        """Inside a write transaction that waited ``waited_s`` for its lock, before the work."""



async def write_event(db: Redacting, session_id: int | None, record: EventRecord) -> None:
    """Append ``record`` to the event log, inside the caller's transaction."""
    kind, data = to_row(record)
    await db.execute("INSERT INTO events (session_id, kind, data, at) VALUES (?, ?, ?, ?)",
                     (session_id, Own(kind), db.json(data), time.time()))


def _checked_path(path: Path | str, *, create: bool) -> Path:
    """``path`` as a database to open: it and SQLite's files beside it kforge's own, and there
    unless a new one may be created."""
    path = Path(path)
    check_database_files(path)
    if not create and not path.exists():
        raise KforgeError(f"no kforge database at {path} (profile a model first, "
                          "or point --db / KFORGE_DB at an existing one)")
    return path


async def _connect(path: Path, target: Path | str, timeout_s: float) -> aiosqlite.Connection:
    try:
        return await aiosqlite.connect(target, uri=isinstance(target, str),
                                       isolation_level=None, timeout=timeout_s)
    except DB_ERRORS as exc:
        raise explain(exc, path) from None


def _newer(path: Path, version: int) -> str:
    return (f"{path} was written by a newer kforge (schema {version}, this one knows "
            f"{LATEST}): upgrade kforge")


class _Deadline:
    """When the statement under way is stopped (None: never). SQLite asks ``overdue`` in the
    connection's thread; it holds nothing of the store, so that a store nobody closed is still
    collected, and its connection's thread ended, as soon as it is dropped."""

    def __init__(self) -> None:
        self.at: float | None = None

    def overdue(self) -> int:
        """SQLite's progress handler: nonzero stops the statement."""
        return int(self.at is not None and time.monotonic() > self.at)


def is_lock(exc: sqlite3.Error | UnicodeDecodeError) -> bool:
    if isinstance(exc, UnicodeDecodeError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


def explain(exc: sqlite3.Error | UnicodeDecodeError, path: Path) -> KforgeError:
    if isinstance(exc, UnicodeDecodeError):
        return KforgeError(f"{path} is not a kforge database or it is corrupt (SQLite's message "
                           "about it is garbled bytes)")
    text = str(exc)
    if is_lock(exc):
        return KforgeError(f"database {path} is locked by another process; try again in a moment")
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return KforgeError(f"{path} is not a kforge database or it is corrupt ({text})")
    if "unable to open" in text or "readonly" in text or "read-only" in text:
        return KforgeError(f"cannot open database {path}: {text}")
    return KforgeError(f"database error in {path}: {text}")
