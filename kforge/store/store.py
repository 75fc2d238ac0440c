"""The session store: one SQLite file (WAL) per workspace, shared by one engine and many viewers.

Every state change is one transaction that also appends a record (``kforge.store.events``) to the
numbered ``events`` table, so a viewer in another process can tail ``events_since(seq)`` and never
miss or half-see a change. Sample inputs live beside the database in ``samples/<session id>/``.

Durability is the ``[store] durability`` setting (``kforge.core.settings.StoreSettings``): by
default ``full`` (SQLite ``synchronous = FULL``), so every committed transaction (a finished
evaluation, its cost) survives a power loss, at the price of one fsync per commit.

A database holds data only: it opens only when its schema is exactly kforge's for its version
(``check_schema``), before anything else is read or written, so no trigger, view, virtual table or
generated column of anyone else's runs as kforge reads or writes it (a trigger in a crafted
database rewrote what kforge had just checked, such as the plug-ins a session names, as kforge
saved it; a view over an endless recursive query hung every reader). Every read is bounded in
rows (a list the database could make as long as it likes ends with one line saying so) and in
time (``READ_LIMIT_S``).

A store that holds a session's engine lease (``claim_engine``) belongs to that engine: a write that
finds the database locked by another process (a backup, an ``sqlite3`` shell) waits it out with
backoff for as long as it takes, saying that it waits, instead of failing the search; and each write
first checks that the lease is still its own, so an engine whose lease was taken over stops
writing at once (``LeaseLost``). Viewers' stores fail fast on a lock instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import sqlite3
import time
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite

from kforge.core.candidate import Baseline, Candidate, EvalOutcome, LlmCall
from kforge.core.mcts import Action
from kforge.core.opcard import OpCard
from kforge.core.secrets import redact, redact_values
from kforge.core.settings import SessionSettings
from kforge.errors import KforgeError
from kforge.store.beside import check_database_files, own_folder
from kforge.store.config import configured_durability, configured_secrets
from kforge.store.events import (
    CardsAdded,
    CardUpdated,
    CommandDone,
    CommandSent,
    EngineAttached,
    Event,
    EventRecord,
    LogLine,
    ModelMeasured,
    NodeAdded,
    NodeDeleted,
    NodeFinished,
    NodePruned,
    NodeUpdated,
    SessionCreated,
    SessionDeleted,
    SessionSettingsChanged,
    SessionStatusChanged,
    from_row,
    kind_of,
    to_row,
)
from kforge.store.records import (
    CardRow,
    CardStatus,
    Command,
    NodeDetail,
    NOTHING,
    NUMBER,
    NodeRow,
    NodeStatus,
    Session,
    SessionStatus,
    SessionSummary,
    column,
    dumps,
    json_column,
    loads,
    reading,
    time_column,
)
from kforge.store.schema import LATEST, MIGRATIONS, SchemaObject, normalized, schema_objects

log = logging.getLogger("kforge.store")

# An engine on another host that has not written a heartbeat for this long is taken to be gone
# (on this host the process table says whether it still runs).
ENGINE_STALE_S = 20.0
# SQLite's durability level. FULL: a commit is on disk before it returns, so no finished result
# is lost on power loss (NORMAL, with WAL, may lose the last commits).
SYNCHRONOUS = {"full": "FULL", "normal": "NORMAL"}
LOCK_BACKOFF_S = (0.05, 1.0)  # first and longest pause between waits for another's write lock
# What the SQLite driver raises for a database it cannot use: its own errors, and the
# UnicodeDecodeError it raises where SQLite's error message (quoting a damaged schema) is not UTF-8.
DB_ERRORS = (sqlite3.Error, UnicodeDecodeError)
# The longest one read may take, and how many of a kind one read returns at most: a database
# holding more is refused with one line, never read into memory whole.
READ_LIMIT_S = 30.0
PROGRESS_STEPS = 10_000  # SQLite instructions between two looks at the clock
MAX_SESSIONS, MAX_CARDS, MAX_NODES, MAX_ROWS = 10_000, 100_000, 200_000, 10_000
_CARD_FIELDS = ("status", "stop_reason", "spent", "best_node", "best_speedup", "eager_us",
                "compiled_us", "floor_us", "baseline")
_NODE_COLUMNS = ("id, session_id, card_id, parent_id, action, status, meta, reward, speedup, "
                 "median_us, repairable, pruned, summary, usd, created_at, finished_at, "
                 "confirmed")


class Own(str):
    """Text that names kforge's own things (an op, a card key, a model's path, an op card's
    arguments as JSON, an event's kind): stored as it is, never passed through redaction,
    which would rewrite it wherever a secret happened to match part of it."""


class _Redacting:
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


class Store:
    """Async access to one kforge database file. Open with ``await Store.open(path)``."""

    def __init__(self, db: aiosqlite.Connection, path: Path) -> None:
        self._db = _Redacting(db, configured_secrets())
        self.path = path
        self._clock = _Deadline()  # when the read under way is stopped
        self._lock = asyncio.Lock()
        self._lease: _Lease | None = None  # the engine lease this store holds
        self._lost: LeaseLost | None = None  # set once that lease was found taken over
        self.read_only = False  # opened by open_read_only: every write fails

    # ----- opening -----

    @classmethod
    async def open(cls, path: Path | str, *, create: bool = True, timeout_s: float = 5.0) -> Store:
        """Open (and if needed create and migrate) the database at ``path``.

        With ``create=False`` a missing file is an error instead of a new database, so read-only
        commands change nothing on disk.
        """
        path = Path(path)
        check_database_files(path)
        if not path.exists():
            if not create:
                raise KforgeError(f"no kforge database at {path} (profile a model first, "
                                  "or point --db / KFORGE_DB at an existing one)")
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
        try:
            db = await aiosqlite.connect(path, isolation_level=None, timeout=timeout_s)
        except DB_ERRORS as exc:
            raise _explain(exc, path) from None
        try:  # a connection left open keeps its thread, and the process, alive
            store = cls(db, path)
            await store._setup(timeout_s)
            check_database_files(path)  # as SQLite left them: what it made is its own
        except BaseException:
            await db.close()
            raise
        return store

    @classmethod
    async def open_to_browse(cls, path: Path | str) -> Store:
        """An existing database for a viewer: read-only where this process may not write the
        file or its folder (a write then fails with one line), else as ``open`` opens it."""
        path = Path(path)
        if path.exists() and not (os.access(path, os.W_OK) and os.access(path.parent, os.W_OK)):
            return await cls.open_read_only(path)
        return await cls.open(path, create=False)

    @classmethod
    async def open_read_only(cls, path: Path | str, *, timeout_s: float = 5.0) -> Store:
        """Open an existing database for browsing without writing to it, even where this process
        may not write (a read-only file or folder): nothing on disk changes, and a write fails.
        Where SQLite cannot create the shared-memory file a WAL database needs beside it, the
        file is read as immutable (as it stands, with no locking: nobody can write it there)."""
        path = Path(path)
        check_database_files(path)
        if not path.exists():
            raise KforgeError(f"no kforge database at {path} (profile a model first, "
                              "or point --db / KFORGE_DB at an existing one)")
        if not os.access(path, os.R_OK):
            raise KforgeError(f"cannot open database {path}: no permission to read it")
        for mode in ("mode=ro", "mode=ro&immutable=1"):
            try:
                db = await aiosqlite.connect(f"{path.absolute().as_uri()}?{mode}", uri=True,
                                             isolation_level=None, timeout=timeout_s)
            except DB_ERRORS as exc:
                raise _explain(exc, path) from None
            db.row_factory = aiosqlite.Row
            try:
                version = (await (await db.execute("PRAGMA user_version")).fetchone())[0]
                break
            except DB_ERRORS as exc:
                await db.close()
                error = _explain(exc, path)
        else:
            raise error
        if version != LATEST:
            await db.close()
            raise KforgeError(f"{path} holds kforge schema {version}, this kforge reads "
                              f"{LATEST}: open it once where it can be written to upgrade it"
                              if version < LATEST else
                              f"{path} was written by a newer kforge (schema {version}, this "
                              f"one knows {LATEST}): upgrade kforge")
        try:
            store = cls(db, path)
            await store._bound_reads()
            await store._check_schema(version)
            check_database_files(path)
            store.read_only = True
            return store
        except DB_ERRORS as exc:  # a schema SQLite cannot read
            await db.close()
            raise _explain(exc, path) from None
        except BaseException:
            await db.close()
            raise

    async def _setup(self, timeout_s: float) -> None:
        db = self._db
        db.row_factory = aiosqlite.Row
        try:
            await db.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
            await self._bound_reads()
            version = (await (await db.execute("PRAGMA user_version")).fetchone())[0]
            if version > LATEST:
                raise KforgeError(f"{self.path} was written by a newer kforge (schema {version}, "
                                  f"this one knows {LATEST}): upgrade kforge")
            await self._check_schema(version)
            await db.execute("PRAGMA foreign_keys = ON")
            mode = (await (await db.execute("PRAGMA journal_mode = WAL")).fetchone())[0]
            if mode.lower() != "wal":
                raise KforgeError(f"{self.path} cannot use write-ahead logging (journal mode "
                                  f"stays {mode!r}); put the database on a local disk")
            await db.execute(f"PRAGMA synchronous = {SYNCHRONOUS[configured_durability()]}")
            if version < LATEST:
                await self._migrate()
        except DB_ERRORS as exc:
            raise _explain(exc, self.path) from None

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

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @asynccontextmanager
    async def transaction(self, *, patient: bool = False
                          ) -> AsyncIterator[_Redacting]:
        """One write transaction (BEGIN IMMEDIATE: it takes the write lock up front), rolled back
        on any error or cancellation. A ``patient`` transaction, and every one while this store
        holds an engine lease, waits out another process's lock; under a lease it is refused
        with LeaseLost once the lease is no longer this store's."""
        async with self._lock:
            if self._lost is not None:
                raise self._lost
            waited_s = await self._begin(patient or self._lease is not None)
            try:
                await self._check_lease()
                if waited_s and self._lease is not None:
                    await self._event(self._db, self._lease.session_id, LogLine(
                        message=f"waited {waited_s:.0f} s for another process to release the "
                                "database's write lock", level="warning"))
                yield self._db
            except DB_ERRORS as exc:  # e.g. a write to a database opened read-only
                await self._rollback()
                raise _explain(exc, self.path) from None
            except BaseException:
                await self._rollback()
                raise
            try:
                await self._settle("COMMIT")
            except DB_ERRORS as exc:
                await self._rollback()
                raise _explain(exc, self.path) from None

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
                if not (patient and _is_lock(exc)):
                    raise _explain(exc, self.path) from None
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

    async def _check_lease(self) -> None:
        """Under an engine lease, refuse to write once another engine (or a stop of an engine
        that looked dead) has taken the session over."""
        lease = self._lease
        if lease is None:
            return
        row = await (await self._db.execute(
            "SELECT engine_pid, engine_host FROM sessions WHERE id = ?",
            (lease.session_id,))).fetchone()
        if row is not None and (row["engine_pid"], row["engine_host"]) == (lease.pid, lease.host):
            return
        holder = (f"process {row['engine_pid']} on {row['engine_host']}"
                  if row is not None and row["engine_pid"] else "no engine")
        self._lost = LeaseLost(f"session {lease.session_id} is no longer searched by this "
                               f"engine (its lease is now held by {holder}); stopped writing")
        raise self._lost

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
                raise _explain(exc, self.path) from None
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

    @staticmethod
    async def _event(db: _Redacting, session_id: int | None, record: EventRecord) -> None:
        kind, data = to_row(record)
        await db.execute("INSERT INTO events (session_id, kind, data, at) VALUES (?, ?, ?, ?)",
                         (session_id, Own(kind), db.json(data), time.time()))

    # ----- files beside the database -----

    @property
    def samples_root(self) -> Path:
        """``samples/`` beside the database; a KforgeError where it is a link."""
        return own_folder(self.path.parent, "samples")

    def samples_dir(self, session_id: int) -> Path:
        return own_folder(self.path.parent, "samples", str(session_id))

    # ----- sessions -----

    async def create_session(self, model: str, settings: dict, gpu: dict,
                             status: SessionStatus = SessionStatus.READY) -> int:
        async with self.transaction() as db:
            return await self._insert_session(db, model, settings, gpu, status)

    async def _insert_session(self, db: _Redacting, model: str, settings: dict,
                              gpu: dict, status: SessionStatus) -> int:
        now = time.time()
        cur = await db.execute(
            "INSERT INTO sessions (model, gpu, settings, status, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?)", (Own(model), db.json(gpu), db.json(settings), status,
                                          now, now))
        session_id = cur.lastrowid
        await self._event(db, session_id, SessionCreated(model=model, status=status))
        return session_id

    async def create_profiled_session(self, model: str, settings: dict, gpu: dict,
                                      cards: list[OpCard], staging_dir: Path | None = None,
                                      modules: dict[str, list[str]] | None = None) -> int:
        """Create a session and its op cards in one transaction, then move the profile's
        samples from ``staging_dir`` into the session's samples folder."""
        async with self.transaction() as db:
            session_id = await self._insert_session(db, model, settings, gpu, SessionStatus.READY)
            await self._insert_cards(db, session_id, cards, modules or {})
        if staging_dir is not None and staging_dir.exists():
            target = self.samples_dir(session_id)
            if target.exists():  # left by a session id reused after a crash: not ours
                shutil.rmtree(target)
            staging_dir.replace(target)
        return session_id

    async def get_session(self, session_id: int) -> Session:
        rows = await self._read("SELECT * FROM sessions WHERE id = ?", (session_id,))
        if not rows:
            raise KforgeError(f"no session {session_id} in {self.path} (see `kforge sessions`)")
        return _session(rows[0])

    async def list_sessions(self) -> list[SessionSummary]:
        rows = await self._read(
            """SELECT s.*,
                 (SELECT count(*) FROM op_cards c WHERE c.session_id = s.id) AS n_cards,
                 (SELECT count(*) FROM op_cards c WHERE c.session_id = s.id AND c.target)
                     AS n_targets,
                 (SELECT count(*) FROM nodes n WHERE n.session_id = s.id) AS n_nodes,
                 (SELECT count(*) FROM op_cards c WHERE c.session_id = s.id
                     AND c.best_speedup > 1) AS n_improved,
                 (SELECT max(c.best_speedup) FROM op_cards c WHERE c.session_id = s.id)
                     AS top_speedup,
                 max(s.updated_at, coalesce((SELECT max(at) FROM events e
                     WHERE e.session_id = s.id), 0)) AS last_activity
               FROM sessions s ORDER BY s.id""", at_most=MAX_SESSIONS, what="sessions")
        return [_summary(r) for r in rows]

    async def set_session_status(self, session_id: int, status: SessionStatus,
                                 error: str = "") -> None:
        async with self.transaction() as db:
            await db.execute("UPDATE sessions SET status = ?, error = ?, updated_at = ? "
                             "WHERE id = ?", (status, error, time.time(), session_id))
            await self._event(db, session_id, SessionStatusChanged(status=status, error=error))

    async def update_settings(self, session_id: int, changes: dict) -> dict:
        async with self.transaction() as db:
            row = await (await db.execute("SELECT settings FROM sessions WHERE id = ?",
                                          (session_id,))).fetchone()
            if row is None:
                raise KforgeError(f"no session {session_id} in {self.path}")
            with reading(f"session {session_id}"):
                settings = {**json_column(row, "settings", dict, {}), **changes}
            await db.execute("UPDATE sessions SET settings = ?, updated_at = ? WHERE id = ?",
                             (db.json(settings), time.time(), session_id))
            await self._event(db, session_id, SessionSettingsChanged(changes=changes))
            return settings

    async def delete_session(self, session_id: int) -> None:
        await self.get_session(session_id)
        samples = self.samples_dir(session_id)  # checked before anything is deleted
        async with self.transaction() as db:
            await db.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
            await self._event(db, session_id, SessionDeleted())
        shutil.rmtree(samples, ignore_errors=True)

    # ----- the engine lease -----

    async def claim_engine(self, session_id: int, pid: int | None = None,
                           host: str | None = None) -> None:
        """Take the session's engine lease for this store (this process unless ``pid``/``host``
        say otherwise); refuse if a live engine holds it. From then on this store waits out locks
        and writes only while the lease is its own."""
        pid, host = pid or os.getpid(), host or socket.gethostname()
        async with self.transaction(patient=True) as db:
            row = await (await db.execute(
                "SELECT engine_pid, engine_host, heartbeat_at FROM sessions WHERE id = ?",
                (session_id,))).fetchone()
            if row is None:
                raise KforgeError(f"no session {session_id} in {self.path}")
            if engine_alive(row["engine_pid"], row["engine_host"], row["heartbeat_at"]):
                raise KforgeError(f"session {session_id} is already being searched by process "
                                  f"{row['engine_pid']} on {row['engine_host']}")
            await db.execute(
                "UPDATE sessions SET engine_pid = ?, engine_host = ?, heartbeat_at = ?, "
                "updated_at = ? WHERE id = ?", (pid, host, time.time(), time.time(), session_id))
            await self._event(db, session_id, EngineAttached(pid=pid, host=host))
        self._lease, self._lost = _Lease(session_id, pid, host), None

    async def heartbeat(self, session_id: int, run_seconds: float) -> None:
        """Prove the engine is alive and record the total wall time the session was searched."""
        async with self.transaction() as db:
            await db.execute("UPDATE sessions SET heartbeat_at = ?, run_seconds = ? WHERE id = ?",
                             (time.time(), run_seconds, session_id))

    async def release_engine(self, session_id: int, status: SessionStatus, error: str = "") -> None:
        async with self.transaction() as db:
            await db.execute(
                "UPDATE sessions SET engine_pid = NULL, engine_host = NULL, heartbeat_at = NULL, "
                "status = ?, error = ?, updated_at = ? WHERE id = ?",
                (status, error, time.time(), session_id))
            await self._event(db, session_id, SessionStatusChanged(status=status, error=error))
        if self._lease is not None and self._lease.session_id == session_id:
            self._lease = None

    # ----- op cards -----

    async def _insert_cards(self, db: _Redacting, session_id: int, cards: list[OpCard],
                            modules: dict[str, list[str]]) -> None:
        for c in cards:
            status = CardStatus.PENDING if c.target else CardStatus.SKIPPED
            await db.execute(
                "INSERT INTO op_cards (session_id, key, op, args, kwargs, calls, total_us, share, "
                "library, target, modules, eager_us, compiled_us, floor_us, status, region, "
                "ranges) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (session_id, Own(c.key), Own(c.op), Own(dumps(c.args)), Own(dumps(c.kwargs)),
                 c.calls, c.total_us, c.share, Own(c.library), int(c.target),
                 Own(dumps(modules.get(c.key, []))), c.eager_us, c.compiled_us, c.floor_us,
                 status, None if c.region is None else Own(dumps(c.region)),
                 None if c.ranges is None else Own(dumps(c.ranges))))
        await self._event(db, session_id, CardsAdded(count=len(cards)))

    async def list_cards(self, session_id: int) -> list[CardRow]:
        rows = await self._read("SELECT * FROM op_cards WHERE session_id = ? "
                                "ORDER BY target DESC, share DESC, id", (session_id,),
                                at_most=MAX_CARDS, what="op cards in one session")
        return [_card(r) for r in rows]

    async def get_card(self, card_id: int) -> CardRow:
        rows = await self._read("SELECT * FROM op_cards WHERE id = ?", (card_id,))
        if not rows:
            raise KforgeError(f"no op card {card_id}")
        return _card(rows[0])

    async def update_card(self, card_id: int, **changes: Any) -> None:
        async with self.transaction() as db:
            await self._update_card(db, card_id, changes)

    async def _update_card(self, db: _Redacting, card_id: int,
                           changes: dict[str, Any]) -> None:
        bad = set(changes) - set(_CARD_FIELDS)
        if bad:
            raise ValueError(f"not card fields: {sorted(bad)}")
        if not changes:
            return
        values = [db.json(v) if k == "baseline" else v for k, v in changes.items()]
        sets = ", ".join(f"{k} = ?" for k in changes)
        cur = await db.execute(f"UPDATE op_cards SET {sets} WHERE id = ? RETURNING session_id",
                               (*values, card_id))
        row = await cur.fetchone()
        await cur.close()
        if row is None:
            raise KforgeError(f"no op card {card_id}")
        await self._event(db, row[0], CardUpdated(
            card_id=card_id, changes={k: v for k, v in changes.items() if k != "baseline"}))

    # ----- search nodes -----

    async def add_node(self, session_id: int, card_id: int, parent_id: int | None,
                       action: str) -> int:
        async with self.transaction() as db:
            cur = await db.execute(
                "INSERT INTO nodes (session_id, card_id, parent_id, action, status, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (session_id, card_id, parent_id, action, NodeStatus.PROPOSING, time.time()))
            node_id = cur.lastrowid
            await self._event(db, session_id, NodeAdded(node_id=node_id, card_id=card_id,
                                                        parent_id=parent_id, action=action))
            return node_id

    async def set_candidate(self, node_id: int, candidate: Candidate,
                            calls: list[LlmCall] = ()) -> None:
        """The proposer delivered: store the code and what it cost, in one transaction."""
        async with self.transaction() as db:
            row = await self._node_owner(db, node_id)
            usd = sum(c.usd for c in calls)
            await db.execute(
                "UPDATE nodes SET status = ?, source = ?, plan = ?, meta = ?, "
                "usd = usd + ? WHERE id = ?", (NodeStatus.EVALUATING, candidate.source,
                                               db.json(candidate.plan), db.json(candidate.meta),
                                               usd, node_id))
            await self._insert_calls(db, row["session_id"], row["card_id"], node_id, calls)
            await self._event(db, row["session_id"], NodeUpdated(
                node_id=node_id, card_id=row["card_id"], status=NodeStatus.EVALUATING))

    async def fail_proposal(self, node_id: int, error: str,
                            calls: list[LlmCall] = ()) -> CardRow:
        """The proposer gave nothing usable: the node is final, and its cost is still counted.
        Returns the card as it stands with the node counted (see ``_tally_card``)."""
        async with self.transaction() as db:
            row = await self._node_owner(db, node_id)
            await db.execute(
                "UPDATE nodes SET status = ?, summary = ?, usd = usd + ?, finished_at = ? "
                "WHERE id = ?", (NodeStatus.NO_CANDIDATE, error[:500], sum(c.usd for c in calls),
                                 time.time(), node_id))
            await self._insert_calls(db, row["session_id"], row["card_id"], node_id, calls)
            card = await self._tally_card(db, row["card_id"])
            await self._event(db, row["session_id"], NodeFinished(
                node_id=node_id, card_id=row["card_id"], status=NodeStatus.NO_CANDIDATE))
            return card

    async def finish_node(self, node_id: int, outcome: EvalOutcome, reward: float | None, *,
                          confirming: bool = False, confirmed: bool = False) -> CardRow:
        """Record an evaluation and the card's new count and best in one transaction; returns
        the card as it stands with the node counted (see ``_tally_card``). ``confirming``: the
        node is a would-be best waiting for its confirmation (never the card's best meanwhile);
        ``confirmed``: it passed one. A confirmation's verdict on a confirming node is recorded
        the same way, the node keeping the time its evaluation finished."""
        status = NodeStatus.CONFIRMING if confirming else outcome.status.value
        async with self.transaction() as db:
            row = await self._node_owner(db, node_id)
            median = outcome.timing.median_us if outcome.timing else None
            await db.execute(
                "UPDATE nodes SET status = ?, reward = ?, speedup = ?, median_us = ?, "
                "repairable = ?, summary = ?, confirmed = ?, "
                "finished_at = coalesce(finished_at, ?) WHERE id = ?",
                (status, reward, outcome.speedup if outcome.ok else None, median,
                 int(outcome.status.repairable), outcome.summary[:500], int(confirmed),
                 time.time(), node_id))
            await db.execute("INSERT OR REPLACE INTO evaluations (node_id, outcome) VALUES (?, ?)",
                             (node_id, db.json(outcome.to_dict())))
            card = await self._tally_card(db, row["card_id"])
            await self._event(db, row["session_id"], NodeFinished(
                node_id=node_id, card_id=row["card_id"], status=status,
                speedup=outcome.speedup))
            return card

    async def _tally_card(self, db: aiosqlite.Connection, card_id: int) -> CardRow:
        """Set the card's count and best from its finished nodes as the database holds them,
        inside the caller's transaction: results finishing in parallel each count once, and the
        best is the fastest confirmed node (the first to finish among equals)."""
        cur = await db.execute(
            "WITH finished AS (SELECT id, speedup, finished_at, status, confirmed FROM nodes "
            "                  WHERE card_id = :card AND finished_at IS NOT NULL), "
            "best AS (SELECT id, speedup FROM finished WHERE speedup IS NOT NULL "
            "         AND status = 'ok' AND confirmed = 1 "
            "         ORDER BY speedup DESC, finished_at, id LIMIT 1) "
            "UPDATE op_cards SET spent = (SELECT count(*) FROM finished), "
            "best_node = (SELECT id FROM best), best_speedup = (SELECT speedup FROM best) "
            "WHERE id = :card RETURNING *", {"card": card_id})
        row = await cur.fetchone()
        await cur.close()
        card = _card(row)
        await self._event(db, row["session_id"], CardUpdated(card_id=card_id, changes={
            "spent": card.spent, "best_node": card.best_node, "best_speedup": card.best_speedup}))
        return card

    async def delete_node(self, node_id: int) -> None:
        """Drop an in-flight node whose work will be redone (after a crash)."""
        async with self.transaction() as db:
            row = await self._node_owner(db, node_id)
            await db.execute("DELETE FROM nodes WHERE id = ?", (node_id,))
            await self._event(db, row["session_id"],
                              NodeDeleted(node_id=node_id, card_id=row["card_id"]))

    async def set_pruned(self, node_id: int, pruned: bool) -> None:
        async with self.transaction() as db:
            row = await self._node_owner(db, node_id)
            await db.execute("UPDATE nodes SET pruned = ? WHERE id = ?", (int(pruned), node_id))
            await self._event(db, row["session_id"], NodePruned(
                node_id=node_id, card_id=row["card_id"], pruned=pruned))

    async def list_nodes(self, session_id: int, card_id: int | None = None,
                         after_id: int = 0) -> list[NodeRow]:
        sql = f"SELECT {_NODE_COLUMNS} FROM nodes WHERE session_id = ? AND id > ?"
        params: list[Any] = [session_id, after_id]
        if card_id is not None:
            sql += " AND card_id = ?"
            params.append(card_id)
        return [_node(r) for r in await self._read(sql + " ORDER BY id", params, at_most=MAX_NODES,
                                                   what="search nodes in one session")]

    async def get_nodes(self, node_ids: Iterable[int]) -> list[NodeRow]:
        ids = list(node_ids)
        if not ids:
            return []
        marks = ",".join("?" * len(ids))
        rows = await self._read(f"SELECT {_NODE_COLUMNS} FROM nodes WHERE id IN ({marks}) "
                                "ORDER BY id", ids)
        return [_node(r) for r in rows]

    async def get_node(self, node_id: int) -> NodeDetail:
        rows = await self._read(f"SELECT {_NODE_COLUMNS}, source, plan FROM nodes "
                                "WHERE id = ?", (node_id,))
        if not rows:
            raise KforgeError(f"no search node {node_id}")
        r = rows[0]
        row = _node(r)
        with reading(f"the kernel of search node {node_id}"):
            candidate = (Candidate(source=column(r, "source", str),
                                   plan=json_column(r, "plan", object),
                                   meta=row.meta)
                         if r["source"] is not None else None)
        ev = await self._read("SELECT outcome FROM evaluations WHERE node_id = ?", (node_id,))
        with reading(f"the evaluation of search node {node_id}"):
            outcome = EvalOutcome.from_dict(json_column(ev[0], "outcome", dict)) if ev else None
        calls = await self._read("SELECT model, input_tokens, output_tokens, usd, seconds, prompt, "
                                 "reply, error, created_at FROM llm_calls WHERE node_id = ? "
                                 "ORDER BY id", (node_id,), at_most=MAX_ROWS,
                                 what="language-model calls of one node")
        return NodeDetail(row=row, candidate=candidate, outcome=outcome,
                          llm_calls=[_llm_call(c, node_id) for c in calls])

    async def _node_owner(self, db: aiosqlite.Connection, node_id: int) -> aiosqlite.Row:
        row = await (await db.execute("SELECT session_id, card_id FROM nodes WHERE id = ?",
                                      (node_id,))).fetchone()
        if row is None:
            raise KforgeError(f"no search node {node_id}")
        return row

    # ----- LLM calls and cost -----

    async def _insert_calls(self, db: aiosqlite.Connection, session_id: int, card_id: int,
                            node_id: int, calls: Iterable[LlmCall]) -> None:
        total = 0.0
        for c in calls:
            total += c.usd
            await db.execute(
                "INSERT INTO llm_calls (session_id, card_id, node_id, model, input_tokens, "
                "output_tokens, usd, seconds, prompt, reply, error, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (session_id, card_id, node_id, c.model, c.input_tokens, c.output_tokens, c.usd,
                 c.seconds, c.prompt, c.reply, c.error, time.time()))
        if total:
            await db.execute("UPDATE sessions SET usd_spent = usd_spent + ? WHERE id = ?",
                             (total, session_id))

    # ----- commands from viewers to the engine -----

    async def send_command(self, session_id: int, kind: str, arg: Any = None) -> int:
        await self.get_session(session_id)
        async with self.transaction() as db:
            cur = await db.execute("INSERT INTO commands (session_id, kind, arg, created_at) "
                                   "VALUES (?, ?, ?, ?)", (session_id, kind, db.json(arg),
                                                           time.time()))
            await self._event(db, session_id,
                              CommandSent(command_id=cur.lastrowid, command=kind, arg=arg))
            return cur.lastrowid

    async def pending_commands(self, session_id: int) -> list[Command]:
        rows = await self._read("SELECT * FROM commands WHERE session_id = ? AND done_at IS NULL "
                                "ORDER BY id", (session_id,), at_most=MAX_ROWS,
                                what="pending commands")
        return [_command(r) for r in rows]

    async def ack_command(self, command_id: int, result: str) -> None:
        async with self.transaction() as db:
            row = await (await db.execute("SELECT session_id FROM commands WHERE id = ?",
                                          (command_id,))).fetchone()
            await db.execute("UPDATE commands SET done_at = ?, result = ? WHERE id = ?",
                             (time.time(), result, command_id))
            await self._event(db, row["session_id"] if row else None,
                              CommandDone(command_id=command_id, result=result))

    # ----- events and the session log -----

    async def log(self, session_id: int, message: str, level: str = "info") -> None:
        async with self.transaction() as db:
            await self._event(db, session_id, LogLine(message=message, level=level))

    async def events_since(self, after_seq: int = 0, session_id: int | None = None,
                           limit: int = 1000) -> list[Event]:
        sql, params = "SELECT * FROM events WHERE seq > ?", [after_seq]
        if session_id is not None:
            sql += " AND session_id = ?"
            params.append(session_id)
        rows = await self._read(sql + " ORDER BY seq LIMIT ?", [*params, limit])
        return [_event(r) for r in rows]

    async def recent_logs(self, session_id: int, limit: int = 500,
                          upto: int | None = None) -> list[Event]:
        """The session's last ``limit`` log lines (up to event ``upto``), oldest first; each
        event's record is a ``LogLine``."""
        rows = await self._read("SELECT * FROM (SELECT * FROM events WHERE session_id = ? AND "
                                "kind = ? AND seq <= ? ORDER BY seq DESC LIMIT ?) ORDER BY seq",
                                (session_id, kind_of(LogLine),
                                 upto if upto is not None else 2**62, limit))
        return [_event(r) for r in rows]

    async def add_model_measurement(self, session_id: int, measured: ModelMeasured) -> None:
        """Keep a whole-model measurement of the session (``kforge e2e``)."""
        await self.get_session(session_id)
        async with self.transaction() as db:
            await self._event(db, session_id, measured)

    async def latest_model_measurement(self, session_id: int) -> Event | None:
        """The session's last whole-model measurement (its record a ``ModelMeasured``), or
        None if its model was never measured."""
        rows = await self._read("SELECT * FROM events WHERE session_id = ? AND kind = ? "
                                "ORDER BY seq DESC LIMIT 1",
                                (session_id, kind_of(ModelMeasured)))
        return _event(rows[0]) if rows else None

    async def last_seq(self) -> int:
        rows = await self._read("SELECT coalesce(max(seq), 0) FROM events")
        return rows[0][0]


class _Deadline:
    """When the statement under way is stopped (None: never). SQLite asks ``overdue`` in the
    connection's thread; it holds nothing of the store, so that a store nobody closed is still
    collected, and its connection's thread ended, as soon as it is dropped."""

    def __init__(self) -> None:
        self.at: float | None = None

    def overdue(self) -> int:
        """SQLite's progress handler: nonzero stops the statement."""
        return int(self.at is not None and time.monotonic() > self.at)


class LeaseLost(KforgeError):
    """This store's engine lease was taken over: the engine must stop without writing more."""


@dataclass(frozen=True)
class _Lease:
    session_id: int
    pid: int
    host: str


def engine_alive(pid: int | None, host: str | None, heartbeat_at: float | None) -> bool:
    """Whether a recorded engine still runs. On this host its process decides, not the heartbeat
    (a live engine's heartbeat is late while another process holds the database lock); a process
    that started after the engine's last heartbeat only reuses its pid. On another host the
    heartbeat must be fresh."""
    if not pid or pid < 1:  # 0 and -1 would ask about process groups: no engine has them
        return False
    if host == socket.gethostname():
        return _process_runs(pid) and not _started_after(pid, heartbeat_at)
    return heartbeat_at is not None and time.time() - heartbeat_at < ENGINE_STALE_S


def _process_runs(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):  # no such process; a pid beyond any there is
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    try:  # an exited child its parent has not reaped yet is no engine
        return _proc_stat(pid)[0] != "Z"
    except (OSError, ValueError, IndexError):
        return True  # no /proc here: existence is all we know


def _started_after(pid: int, moment: float | None) -> bool:
    """Whether process ``pid`` started after ``moment`` (False where that cannot be told)."""
    if moment is None:
        return False
    try:
        ticks = int(_proc_stat(pid)[19])  # starttime, in clock ticks after boot
        with open("/proc/stat") as stat:
            boot = next(float(line.split()[1]) for line in stat if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return False
    # btime is whole seconds: allow one second either way
    return boot + ticks / os.sysconf("SC_CLK_TCK") > moment + 1.0


def _proc_stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (state first)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()


def _is_lock(exc: sqlite3.Error | UnicodeDecodeError) -> bool:
    if isinstance(exc, UnicodeDecodeError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


def _explain(exc: sqlite3.Error | UnicodeDecodeError, path: Path) -> KforgeError:
    if isinstance(exc, UnicodeDecodeError):
        return KforgeError(f"{path} is not a kforge database or it is corrupt (SQLite's message "
                           "about it is garbled bytes)")
    text = str(exc)
    if _is_lock(exc):
        return KforgeError(f"database {path} is locked by another process; try again in a moment")
    if "not a database" in text or "malformed" in text or "corrupt" in text:
        return KforgeError(f"{path} is not a kforge database or it is corrupt ({text})")
    if "unable to open" in text or "readonly" in text or "read-only" in text:
        return KforgeError(f"cannot open database {path}: {text}")
    return KforgeError(f"database error in {path}: {text}")


def _session(r: aiosqlite.Row) -> Session:
    with reading(f"session {r['id']}"):
        gpu = json_column(r, "gpu", dict, {})
        for key in ("name", "arch"):
            if key in gpu:
                column(gpu, key, str)
        settings = json_column(r, "settings", dict, {})
        SessionSettings.from_stored(settings)  # its tables are tables (bad values are dropped)
        session = Session(id=r["id"], model=column(r, "model", str), gpu=gpu, settings=settings,
                       status=column(r, "status", str), error=column(r, "error", str),
                       created_at=time_column(r, "created_at"),
                       updated_at=time_column(r, "updated_at"),
                       engine_pid=column(r, "engine_pid", (int, NOTHING)),
                       engine_host=column(r, "engine_host", (str, NOTHING)),
                       heartbeat_at=time_column(r, "heartbeat_at", optional=True),
                       usd_spent=column(r, "usd_spent", NUMBER),
                       run_seconds=column(r, "run_seconds", NUMBER))
        session.gpu_info  # noqa: B018  (what readers make of the fingerprint)
        return session


def _summary(r: aiosqlite.Row) -> SessionSummary:
    session = _session(r)
    with reading(f"the op cards of session {r['id']}"):
        return SessionSummary(session=session, cards=r["n_cards"], targets=r["n_targets"],
                              nodes=r["n_nodes"], improved=r["n_improved"],
                              best_speedup=column(r, "top_speedup", (*NUMBER, NOTHING)),
                              last_activity=time_column(r, "last_activity"))


def _card(r: aiosqlite.Row) -> CardRow:
    with reading(f"op card {r['id']}"):
        card = OpCard(op=column(r, "op", str), args=json_column(r, "args", list, []),
                      kwargs=json_column(r, "kwargs", dict, {}), calls=column(r, "calls", int),
                      total_us=column(r, "total_us", NUMBER), share=column(r, "share", NUMBER),
                      library=column(r, "library", str), target=bool(column(r, "target", int)),
                      eager_us=column(r, "eager_us", (*NUMBER, NOTHING)),
                      compiled_us=column(r, "compiled_us", (*NUMBER, NOTHING)),
                      floor_us=column(r, "floor_us", (*NUMBER, NOTHING)), id=r["id"],
                      key=column(r, "key", str), region=json_column(r, "region", (dict, NOTHING)),
                      ranges=json_column(r, "ranges", (dict, NOTHING)))
        # what every reader shows of a card: one that cannot be shown is damaged
        card.signature, card.short_op, card.range_text  # noqa: B018
        baseline = json_column(r, "baseline", (dict, NOTHING))
        if baseline is not None:
            Baseline.from_dict(baseline)  # what a search compares with: one it cannot read
        return CardRow(card=card, status=column(r, "status", str),
                       stop_reason=column(r, "stop_reason", str), spent=column(r, "spent", int),
                       best_node=column(r, "best_node", (int, NOTHING)),
                       best_speedup=column(r, "best_speedup", (*NUMBER, NOTHING)),
                       modules=json_column(r, "modules", list, []), baseline=baseline)


def _event(r: aiosqlite.Row) -> Event:
    with reading(f"event {r['seq']}"):
        return Event(seq=r["seq"], session_id=column(r, "session_id", (int, NOTHING)),
                     at=time_column(r, "at"),
                     record=from_row(column(r, "kind", str), json_column(r, "data", dict, {})))


def _node(r: aiosqlite.Row) -> NodeRow:
    with reading(f"search node {r['id']}"):
        return NodeRow(id=r["id"], session_id=column(r, "session_id", int),
                       card_id=column(r, "card_id", int),
                       parent_id=column(r, "parent_id", (int, NOTHING)),
                       action=Action(column(r, "action", str)).value,
                       status=column(r, "status", str),
                       meta=json_column(r, "meta", dict, {}),
                       reward=column(r, "reward", (*NUMBER, NOTHING)),
                       speedup=column(r, "speedup", (*NUMBER, NOTHING)),
                       median_us=column(r, "median_us", (*NUMBER, NOTHING)),
                       repairable=bool(column(r, "repairable", int)),
                       pruned=bool(column(r, "pruned", int)), summary=column(r, "summary", str),
                       usd=column(r, "usd", NUMBER), created_at=time_column(r, "created_at"),
                       finished_at=time_column(r, "finished_at", optional=True),
                       confirmed=bool(column(r, "confirmed", int)))


def _llm_call(r: aiosqlite.Row, node_id: int) -> dict[str, Any]:
    """One of a node's language-model calls, as its viewers show it."""
    with reading(f"a language-model call of search node {node_id}"):
        return {"model": column(r, "model", str), "input_tokens": column(r, "input_tokens", int),
                "output_tokens": column(r, "output_tokens", int), "usd": column(r, "usd", NUMBER),
                "seconds": column(r, "seconds", NUMBER), "prompt": column(r, "prompt", str),
                "reply": column(r, "reply", str), "error": column(r, "error", str),
                "created_at": time_column(r, "created_at")}


def _command(r: aiosqlite.Row) -> Command:
    with reading(f"command {r['id']}"):
        return Command(id=r["id"], session_id=r["session_id"], kind=column(r, "kind", str),
                       arg=loads(r["arg"]), created_at=time_column(r, "created_at"),
                       done_at=time_column(r, "done_at", optional=True), result=r["result"])
