"""The session store's queries: one SQLite file (WAL) per workspace, shared by one engine and many
viewers.

Every state change is one transaction that also appends a record (``kforge.store.events``) to the
numbered ``events`` table, so a viewer in another process can tail ``events_since(seq)`` and never
miss or half-see a change. Sample inputs live beside the database in ``samples/<session id>/``.
Each stored row is read back by the codec (``kforge.store.records.stored``) inside ``reading``,
which turns a damaged one into one ``DamagedRow`` line. How the database is opened, read and
written is ``kforge.store.connection``'s; the engine lease is ``kforge.store.lease``'s; ``Store``
is the three together.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiosqlite

from kforge.core.candidate import Baseline, Candidate, EvalOutcome, LlmCall
from kforge.core.files import no_link
from kforge.core.opcard import OpCard
from kforge.core.schema import encode
from kforge.core.settings import SessionSettings
from kforge.errors import KforgeError
from kforge.store.beside import legacy_samples_dir, samples_root
from kforge.store.connection import Own, Redacting, write_event
from kforge.store.events import (
    CardsAdded,
    CardUpdated,
    CommandDone,
    CommandSent,
    Event,
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
)
from kforge.store.lease import EngineLease
from kforge.store.records import (
    MOMENT,
    CardRow,
    CardStatus,
    Command,
    LlmCallRow,
    NodeDetail,
    NodeRow,
    NodeStatus,
    Session,
    SessionStatus,
    SessionSummary,
    dumps,
    reading,
    stored,
)

# How many of a kind one read returns at most: a database holding more is refused with one line,
# never read into memory whole.
MAX_SESSIONS, MAX_CARDS, MAX_NODES, MAX_ROWS = 10_000, 100_000, 200_000, 10_000
_CARD_FIELDS = ("status", "stop_reason", "spent", "best_node", "best_speedup", "eager_us",
                "compiled_us", "floor_us", "baseline")
_NODE_COLUMNS = ("id, session_id, card_id, parent_id, action, status, meta, reward, speedup, "
                 "median_us, repairable, pruned, summary, usd, created_at, finished_at, "
                 "confirmed")


class Store(EngineLease):
    """Async access to one kforge database file: its sessions, op cards, search nodes, commands
    and event log. Open with ``await Store.open(path, options=...)``."""

    # ----- files beside the database -----

    @property
    def samples_root(self) -> Path:
        """This database's samples folder (``kforge.store.beside.samples_root``); a
        KforgeError where a step of it is a link."""
        return samples_root(self.path)

    def samples_dir(self, session_id: int) -> Path:
        """Where this database keeps a session's samples: written by a profile, removed with
        the session."""
        return no_link(self.samples_root / str(session_id))

    def samples_to_read(self, session_id: int) -> Path:
        """The session's samples folder, or the shared one of an older kforge where the
        database's own has none (``legacy_samples_dir``; never a link)."""
        own = self.samples_dir(session_id)
        if own.exists():
            return own
        try:
            legacy = legacy_samples_dir(self.path, session_id)
        except KforgeError:  # a link: not followed
            return own
        return legacy if legacy.is_dir() else own

    # ----- sessions -----

    async def create_session(self, model: str, settings: dict, gpu: dict,
                             status: SessionStatus = SessionStatus.READY) -> int:
        async with self.transaction() as db:
            return await self._insert_session(db, model, settings, gpu, status)

    async def _insert_session(self, db: Redacting, model: str, settings: dict,
                              gpu: dict, status: SessionStatus) -> int:
        now = time.time()
        cur = await db.execute(
            "INSERT INTO sessions (model, gpu, settings, status, created_at, updated_at) "
            "VALUES (?, ?, ?, ?, ?, ?)", (Own(model), db.json(gpu), db.json(settings), status,
                                          now, now))
        session_id = cur.lastrowid
        await write_event(db, session_id, SessionCreated(model=model, status=status))
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
                 (SELECT count(*) FROM op_cards c WHERE c.session_id = s.id) AS cards,
                 (SELECT count(*) FROM op_cards c WHERE c.session_id = s.id AND c.target)
                     AS targets,
                 (SELECT count(*) FROM nodes n WHERE n.session_id = s.id) AS nodes,
                 (SELECT count(*) FROM op_cards c WHERE c.session_id = s.id
                     AND c.best_speedup > 1) AS improved,
                 (SELECT max(c.best_speedup) FROM op_cards c WHERE c.session_id = s.id)
                     AS best_speedup,
                 max(s.updated_at, coalesce((SELECT max(at) FROM events e
                     WHERE e.session_id = s.id), 0)) AS last_activity
               FROM sessions s ORDER BY s.id""", at_most=MAX_SESSIONS, what="sessions")
        return [_summary(r) for r in rows]

    async def set_session_status(self, session_id: int, status: SessionStatus,
                                 error: str = "") -> None:
        async with self.transaction() as db:
            await db.execute("UPDATE sessions SET status = ?, error = ?, updated_at = ? "
                             "WHERE id = ?", (status, error, time.time(), session_id))
            await write_event(db, session_id, SessionStatusChanged(status=status, error=error))

    async def update_settings(self, session_id: int, changes: dict) -> dict:
        async with self.transaction() as db:
            row = await (await db.execute("SELECT settings FROM sessions WHERE id = ?",
                                          (session_id,))).fetchone()
            if row is None:
                raise KforgeError(f"no session {session_id} in {self.path}")
            with reading(f"session {session_id}"):
                settings = {**stored(_Settings, row, json_columns={"settings": {}}).settings,
                            **changes}
            await db.execute("UPDATE sessions SET settings = ?, updated_at = ? WHERE id = ?",
                             (db.json(settings), time.time(), session_id))
            await write_event(db, session_id, SessionSettingsChanged(changes=changes))
            return settings

    async def delete_session(self, session_id: int) -> None:
        await self.get_session(session_id)
        samples = self.samples_dir(session_id)  # checked before anything is deleted
        async with self.transaction() as db:
            await db.execute("DELETE FROM sessions WHERE id = ?", (session_id,))
            await write_event(db, session_id, SessionDeleted())
        shutil.rmtree(samples, ignore_errors=True)

    # ----- op cards -----

    async def _insert_cards(self, db: Redacting, session_id: int, cards: list[OpCard],
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
        await write_event(db, session_id, CardsAdded(count=len(cards)))

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

    async def _update_card(self, db: Redacting, card_id: int,
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
        await write_event(db, row[0], CardUpdated(
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
            await write_event(db, session_id, NodeAdded(node_id=node_id, card_id=card_id,
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
            await write_event(db, row["session_id"], NodeUpdated(
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
            await write_event(db, row["session_id"], NodeFinished(
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
            await write_event(db, row["session_id"], NodeFinished(
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
        await write_event(db, row["session_id"], CardUpdated(card_id=card_id, changes={
            "spent": card.spent, "best_node": card.best_node, "best_speedup": card.best_speedup}))
        return card

    async def delete_node(self, node_id: int) -> None:
        """Drop an in-flight node whose work will be redone (after a crash)."""
        async with self.transaction() as db:
            row = await self._node_owner(db, node_id)
            await db.execute("DELETE FROM nodes WHERE id = ?", (node_id,))
            await write_event(db, row["session_id"],
                              NodeDeleted(node_id=node_id, card_id=row["card_id"]))

    async def set_pruned(self, node_id: int, pruned: bool) -> None:
        async with self.transaction() as db:
            row = await self._node_owner(db, node_id)
            await db.execute("UPDATE nodes SET pruned = ? WHERE id = ?", (int(pruned), node_id))
            await write_event(db, row["session_id"], NodePruned(
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
            kernel = stored(_Kernel, r, json_columns={"plan": None})
            candidate = (Candidate(kernel.source, kernel.plan, row.meta)
                         if kernel.source is not None else None)
        ev = await self._read("SELECT outcome FROM evaluations WHERE node_id = ?", (node_id,))
        with reading(f"the evaluation of search node {node_id}"):
            outcome = stored(_Evaluation, ev[0], json_columns={"outcome": None}).outcome \
                if ev else None
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
            await write_event(db, session_id,
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
            await write_event(db, row["session_id"] if row else None,
                              CommandDone(command_id=command_id, result=result))

    # ----- events and the session log -----

    async def log(self, session_id: int, message: str, level: str = "info") -> None:
        async with self.transaction() as db:
            await write_event(db, session_id, LogLine(message=message, level=level))

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
            await write_event(db, session_id, measured)

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


@dataclass(frozen=True)
class _Settings:
    """A session's settings column."""

    settings: dict


@dataclass(frozen=True)
class _Kernel:
    """A node's kernel columns: its source (none before it was proposed) and launch plan, as
    stored (a plan the evaluator refuses is still the node's)."""

    source: str | None
    plan: Any


@dataclass(frozen=True)
class _Evaluation:
    """A node's evaluation row."""

    outcome: EvalOutcome


@dataclass(frozen=True)
class _EventRow:
    """An event row's kind and payload, before they are read as its record."""

    kind: str
    data: dict


def _session(r: aiosqlite.Row) -> Session:
    with reading(f"session {r['id']}"):
        session = stored(Session, r, json_columns={"gpu": {}, "settings": {}})
        SessionSettings.from_stored(session.settings)  # its tables are tables (bad values drop)
        session.gpu_info  # noqa: B018  (what readers make of the fingerprint)
        return session


def _summary(r: aiosqlite.Row) -> SessionSummary:
    session = _session(r)
    with reading(f"the op cards of session {r['id']}"):
        return stored(SessionSummary, r, built={"session": session})


def _card(r: aiosqlite.Row) -> CardRow:
    with reading(f"op card {r['id']}"):
        card = stored(OpCard, r, json_columns={"args": [], "kwargs": {}, "region": None,
                                               "ranges": None}, flags=("target",))
        # what every reader shows of a card: one that cannot be shown is damaged
        card.signature, card.short_op, card.range_text  # noqa: B018
        row = stored(CardRow, r, json_columns={"modules": [], "baseline": None},
                     built={"card": card})
        if row.baseline is not None:
            Baseline.from_dict(row.baseline)  # what a search compares with: one it cannot read
        return row


def _event(r: aiosqlite.Row) -> Event:
    with reading(f"event {r['seq']}"):
        raw = stored(_EventRow, r, json_columns={"data": {}})
        return stored(Event, r, built={"record": from_row(raw.kind, raw.data)},
                      rules={"at": MOMENT})


def _node(r: aiosqlite.Row) -> NodeRow:
    with reading(f"search node {r['id']}"):
        return stored(NodeRow, r, json_columns={"meta": {}},
                      flags=("repairable", "pruned", "confirmed"))


def _llm_call(r: aiosqlite.Row, node_id: int) -> dict[str, Any]:
    """One of a node's language-model calls, as its viewers show it."""
    with reading(f"a language-model call of search node {node_id}"):
        return encode(stored(LlmCallRow, r))


def _command(r: aiosqlite.Row) -> Command:
    with reading(f"command {r['id']}"):
        return stored(Command, r, json_columns={"arg": None})
