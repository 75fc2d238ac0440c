"""The session database schema and its forward migrations, and the schema objects each version
has, which a database must have exactly.

``PRAGMA user_version`` holds the schema version. Each migration is applied once, in order, inside
the transaction that bumps the version; a database from a newer kforge is refused, never altered.

A database opens only when its schema objects are the ones these migrations create for its
version (``schema_objects``), compared by type, name and SQL, case-insensitively and with comments
and spaces left out (``normalized``): a trigger, a view, a virtual table, or a table with a
generated column, a default or a check of someone else's is SQL that SQLite would run as kforge
reads or writes, and none of them is kforge's.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass
from functools import cache

MIGRATIONS: list[str] = [
    # 1: sessions, op cards, search nodes, evaluations, LLM calls, commands, events
    """
    CREATE TABLE sessions (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        model       TEXT NOT NULL,
        gpu         TEXT NOT NULL DEFAULT '{}',
        settings    TEXT NOT NULL DEFAULT '{}',
        status      TEXT NOT NULL,
        error       TEXT NOT NULL DEFAULT '',
        created_at  REAL NOT NULL,
        updated_at  REAL NOT NULL,
        engine_pid  INTEGER,
        engine_host TEXT,
        heartbeat_at REAL,
        usd_spent   REAL NOT NULL DEFAULT 0,
        run_seconds REAL NOT NULL DEFAULT 0
    );
    CREATE TABLE op_cards (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id  INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        key         TEXT NOT NULL,
        op          TEXT NOT NULL,
        args        TEXT NOT NULL,
        kwargs      TEXT NOT NULL,
        calls       INTEGER NOT NULL,
        total_us    REAL NOT NULL,
        share       REAL NOT NULL,
        library     TEXT NOT NULL,
        target      INTEGER NOT NULL,
        modules     TEXT NOT NULL DEFAULT '[]',
        eager_us    REAL,
        compiled_us REAL,
        floor_us    REAL,
        baseline    TEXT,
        status      TEXT NOT NULL DEFAULT 'pending',
        stop_reason TEXT NOT NULL DEFAULT '',
        spent       INTEGER NOT NULL DEFAULT 0,
        best_node   INTEGER,
        best_speedup REAL,
        UNIQUE (session_id, key)
    );
    CREATE TABLE nodes (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id  INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        card_id     INTEGER NOT NULL REFERENCES op_cards(id) ON DELETE CASCADE,
        parent_id   INTEGER REFERENCES nodes(id) ON DELETE CASCADE,
        action      TEXT NOT NULL,
        status      TEXT NOT NULL,
        source      TEXT,
        launcher    TEXT,
        meta        TEXT NOT NULL DEFAULT '{}',
        reward      REAL,
        speedup     REAL,
        median_us   REAL,
        repairable  INTEGER NOT NULL DEFAULT 0,
        pruned      INTEGER NOT NULL DEFAULT 0,
        summary     TEXT NOT NULL DEFAULT '',
        usd         REAL NOT NULL DEFAULT 0,
        created_at  REAL NOT NULL,
        finished_at REAL
    );
    CREATE INDEX nodes_by_card ON nodes (card_id, id);
    CREATE INDEX nodes_by_session ON nodes (session_id, id);
    CREATE TABLE evaluations (
        node_id     INTEGER PRIMARY KEY REFERENCES nodes(id) ON DELETE CASCADE,
        outcome     TEXT NOT NULL
    );
    CREATE TABLE llm_calls (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id  INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        card_id     INTEGER REFERENCES op_cards(id) ON DELETE CASCADE,
        node_id     INTEGER REFERENCES nodes(id) ON DELETE SET NULL,
        model       TEXT NOT NULL,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        usd         REAL NOT NULL,
        seconds     REAL NOT NULL,
        prompt      TEXT NOT NULL DEFAULT '',
        reply       TEXT NOT NULL DEFAULT '',
        error       TEXT NOT NULL DEFAULT '',
        created_at  REAL NOT NULL
    );
    CREATE INDEX llm_calls_by_node ON llm_calls (node_id);
    CREATE TABLE commands (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id  INTEGER NOT NULL REFERENCES sessions(id) ON DELETE CASCADE,
        kind        TEXT NOT NULL,
        arg         TEXT NOT NULL DEFAULT 'null',
        created_at  REAL NOT NULL,
        done_at     REAL,
        result      TEXT NOT NULL DEFAULT ''
    );
    CREATE INDEX commands_pending ON commands (session_id, done_at);
    CREATE TABLE events (
        seq         INTEGER PRIMARY KEY AUTOINCREMENT,
        session_id  INTEGER,
        kind        TEXT NOT NULL,
        data        TEXT NOT NULL DEFAULT '{}',
        at          REAL NOT NULL
    );
    CREATE INDEX events_by_session ON events (session_id, seq);
    """,
    # 2: a candidate's launch plan (JSON) beside its source
    "ALTER TABLE nodes ADD COLUMN plan TEXT",
    # 3: a region card's chain of ops (JSON, kforge.core.region); NULL for an op card
    "ALTER TABLE op_cards ADD COLUMN region TEXT",
    # 4: a range card's symbols and affine laws (JSON, kforge.core.ranges); NULL for an exact card
    "ALTER TABLE op_cards ADD COLUMN ranges TEXT",
    # 5: whether a node's kernel passed its confirmation (the only ones a card's best may be);
    # every best so far had passed one
    """
    ALTER TABLE nodes ADD COLUMN confirmed INTEGER NOT NULL DEFAULT 0;
    UPDATE nodes SET confirmed = 1 WHERE id IN (SELECT best_node FROM op_cards
                                                WHERE best_node IS NOT NULL)
    """,
]

LATEST = len(MIGRATIONS)


# SQL's tokens as SQLite reads them: string literals (kept as written), quoted identifiers,
# comments (an unclosed one runs to the end) and spaces, words, and any other single character.
_TOKEN = re.compile(r"""('(?:[^']|'')*'?)|("(?:[^"]|"")*"?|`(?:[^`]|``)*`?|\[[^\]]*\]?)|"""
                    r"(--[^\n]*|/\*.*?(?:\*/|\Z)|\s+)|([\w$]+)|(.)", re.S)


@dataclass(frozen=True)
class SchemaObject:
    """One row of ``sqlite_master`` as compared: its type, its name and its SQL, each
    ``normalized`` (an automatic index has no SQL)."""

    type: str
    name: str
    sql: tuple[str, ...] | None

    @property
    def kind(self) -> str:
        """What the object is, as its SQL says (SQLite makes it from its SQL alone, whatever
        its type column holds): ``virtual table``, ``trigger``, ``view``, ..."""
        words = [t for t in self.sql or () if t not in ("temp", "temporary")]
        if words[1:3] == ["virtual", "table"]:
            return "virtual table"
        return words[1] if len(words) > 1 else self.type


def normalized(sql: str | None) -> tuple[str, ...] | None:
    """``sql`` as a sequence of tokens, comments and spaces left out, every token but a string
    literal's text lower-cased."""
    if sql is None:
        return None
    tokens = []
    for literal, quoted, _, word, other in _TOKEN.findall(sql):
        if literal:
            tokens.append(literal)
        elif quoted or word or other:
            tokens.append((quoted or word or other).lower())
    return tuple(tokens)


@cache
def schema_objects(version: int) -> frozenset[SchemaObject]:
    """The schema objects the migrations up to ``version`` create, as SQLite records them."""
    db = sqlite3.connect(":memory:")
    try:
        for step in MIGRATIONS[:version]:
            db.executescript(step)
        rows = db.execute("SELECT type, name, sql FROM sqlite_master").fetchall()
    finally:
        db.close()
    return frozenset(SchemaObject(str(t).lower(), str(n).lower(), normalized(q))
                     for t, n, q in rows)
