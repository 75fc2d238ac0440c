"""The event log's records: their stored form, old and unknown rows, and that no other module
spells an event kind."""

from __future__ import annotations

import ast
import json
import re
import sqlite3
from pathlib import Path

import pytest

from kforge.store import NodeStatus, SessionStatus, Store
from kforge.store.events import (
    KINDS,
    RECORD_TYPES,
    CardsAdded,
    CardUpdated,
    CommandDone,
    CommandSent,
    EngineAttached,
    EventFormatError,
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
    UnknownEvent,
    from_row,
    kind_of,
    to_row,
)
from kforge.store.records import dumps
from tests.doubles import sample_cards

ROOT = Path(__file__).resolve().parents[2]

# Each record beside the row kforge has always stored for it: the database format is fixed.
STORED = [
    (SessionCreated("toy", "ready"), "session_created", {"model": "toy", "status": "ready"}),
    (SessionStatusChanged("failed", "boom"), "session_status",
     {"status": "failed", "error": "boom"}),
    (SessionSettingsChanged({"budget": 3}), "session_settings", {"changes": {"budget": 3}}),
    (SessionDeleted(), "session_deleted", {}),
    (EngineAttached(41, "gpu-box"), "engine_attached", {"pid": 41, "host": "gpu-box"}),
    (CardsAdded(4), "cards_added", {"count": 4}),
    (CardUpdated(3, {"spent": 2, "best_node": None}), "card_updated",
     {"card_id": 3, "spent": 2, "best_node": None}),
    (NodeAdded(9, 3, None, "new"), "node_added",
     {"node_id": 9, "card_id": 3, "parent_id": None, "action": "new"}),
    (NodeUpdated(9, 3, "evaluating"), "node_updated",
     {"node_id": 9, "card_id": 3, "status": "evaluating"}),
    (NodeFinished(9, 3, "ok", 1.5), "node_finished",
     {"node_id": 9, "card_id": 3, "status": "ok", "speedup": 1.5}),
    (NodeDeleted(9, 3), "node_deleted", {"node_id": 9, "card_id": 3}),
    (NodePruned(9, 3, True), "node_pruned", {"node_id": 9, "card_id": 3, "pruned": True}),
    (CommandSent(5, "prune", 9), "command", {"command_id": 5, "kind": "prune", "arg": 9}),
    (CommandDone(5, "pruned node 9"), "command_done", {"command_id": 5, "result": "pruned node 9"}),
    (LogLine("slow", "warning"), "log", {"level": "warning", "message": "slow"}),
    (ModelMeasured({"eager": 1.0, "eager+kforge": 1.2}, {"eager+kforge": 1.2}, 1.3),
     "model_measured", {"speedups": {"eager": 1.0, "eager+kforge": 1.2},
                        "gains": {"eager+kforge": 1.2}, "projected": 1.3, "times_us": {},
                        "kernels": {}, "spreads": {}}),
    (UnknownEvent("card_split", {"card_id": 3, "into": [4, 5]}), "card_split",
     {"card_id": 3, "into": [4, 5]}),
]


def test_every_record_type_has_a_stored_example():
    assert {type(r) for r, _, _ in STORED} == {*RECORD_TYPES, UnknownEvent}
    assert {kind for r, kind, _ in STORED if not isinstance(r, UnknownEvent)} == KINDS


@pytest.mark.parametrize(("record", "kind", "payload"), STORED,
                         ids=[kind for _, kind, _ in STORED])
def test_records_are_stored_as_before_and_round_trip(record, kind, payload):
    assert to_row(record) == (kind, payload)
    stored_kind, data = to_row(record)
    assert from_row(stored_kind, json.loads(dumps(data))) == record


def test_rows_written_before_optional_keys_existed_still_decode():
    assert from_row("node_finished", {"node_id": 1, "card_id": 2, "status": "no_candidate"}) \
        == NodeFinished(1, 2, "no_candidate", speedup=None)
    assert from_row("command_done", {"command_id": 1}) == CommandDone(1, "")
    assert from_row("log", {"message": "hi"}) == LogLine("hi", level="info")


def test_an_unknown_kind_is_kept_for_an_older_reader():
    record = from_row("card_split", {"card_id": 3})
    assert record == UnknownEvent("card_split", {"card_id": 3})


def test_a_known_kind_with_a_missing_key_is_a_clear_error():
    with pytest.raises(EventFormatError, match="'node_added' lacks its payload key 'action'"):
        from_row("node_added", {"node_id": 1, "card_id": 2, "parent_id": None})
    with pytest.raises(EventFormatError, match="not an object"):
        from_row("log", ["hi"])
    with pytest.raises(EventFormatError, match="str is not a stored event type"):
        kind_of(str)


async def test_a_database_with_old_and_unknown_rows_reads(tmp_path: Path):
    path = tmp_path / "k.db"
    async with await Store.open(path) as store:
        sid = await store.create_profiled_session("toy", {}, {}, sample_cards())
        start = await store.last_seq()
    raw = sqlite3.connect(path)
    with raw:
        raw.executemany("INSERT INTO events (session_id, kind, data, at) VALUES (?, ?, ?, ?)",
                        [(sid, "log", json.dumps({"level": "info", "message": "old"}), 1.0),
                         (sid, "card_split", json.dumps({"card_id": 1}), 2.0)])
    raw.close()
    async with await Store.open(path, create=False) as store:
        await store.log(sid, "new", "warning")
        await store.set_session_status(sid, SessionStatus.RUNNING)
        records = [e.record for e in await store.events_since(start, sid)]
        logs = [e.record for e in await store.recent_logs(sid)]
    assert records == [LogLine("old"), UnknownEvent("card_split", {"card_id": 1}),
                       LogLine("new", "warning"), SessionStatusChanged(SessionStatus.RUNNING)]
    assert logs == [LogLine("old"), LogLine("new", "warning")]


async def test_the_store_writes_what_viewers_read(tmp_path: Path):
    async with await Store.open(tmp_path / "k.db") as store:
        sid = await store.create_profiled_session("toy", {}, {}, sample_cards())
        card = (await store.list_cards(sid))[0].id
        node = await store.add_node(sid, card, None, "new")
        await store.fail_proposal(node, "nothing usable")
        command = await store.send_command(sid, "prune", node)
        await store.ack_command(command, "pruned")
        records = [e.record for e in await store.events_since(0, sid)]
    assert records == [SessionCreated("toy", SessionStatus.READY), CardsAdded(4),
                       NodeAdded(node, card, None, "new"),
                       CardUpdated(card, {"spent": 1, "best_node": None, "best_speedup": None}),
                       NodeFinished(node, card, NodeStatus.NO_CANDIDATE),
                       CommandSent(command, "prune", node), CommandDone(command, "pruned")]


# ----- nothing outside kforge/store/events.py spells an event kind -----

# "log" and "command" are also ordinary words there (a widget id, an op name, an argparse
# destination), so those two count only where they act as an event kind: compared, matched,
# handed positionally to a call. The other kinds count wherever they appear.
WORD_KINDS = {k for k in KINDS if "_" not in k}
SQL_KIND_FILTER = re.compile(r"\bkind\s*(=|!=|<>|in\b)\s*\(?\s*'", re.IGNORECASE)


def _constants(node: ast.AST) -> list[str]:
    """The string constants ``node`` is or, as a tuple, list or set, holds."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for elt in node.elts for s in _constants(elt)]
    return []


def kind_literals(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of each place in ``source`` that spells an event kind."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in KINDS - WORD_KINDS or SQL_KIND_FILTER.search(node.value):
                found.append((node.lineno, node.value))
        used_as_kind: list[ast.AST] = []
        if isinstance(node, ast.Compare):
            used_as_kind = [node.left, *node.comparators]
        elif isinstance(node, ast.MatchValue):
            used_as_kind = [node.value]
        elif isinstance(node, ast.Call):
            used_as_kind = [arg for arg in node.args if isinstance(arg, ast.Constant)]
        found += [(node.lineno, s) for n in used_as_kind for s in _constants(n)
                  if s in WORD_KINDS]
    return found


def test_the_scan_finds_kinds_spelled_the_old_ways():
    old = """
if kind in ("node_added", "node_updated"):
    pass
elif kind == "log":
    pass
store._event(db, sid, "command", command_id=1)
rows = read("SELECT * FROM events WHERE kind = 'log'")
Log(id="log")
ops = frozenset({"log", "exp"})
"""
    assert [text for _, text in sorted(kind_literals(old))] == [
        "node_added", "node_updated", "log", "command", "SELECT * FROM events WHERE kind = 'log'"]


def test_no_module_but_the_events_module_spells_an_event_kind():
    events_module = ROOT / "kforge" / "store" / "events.py"
    offences = [f"{path.relative_to(ROOT)}:{line}: {text!r}"
                for package in ("kforge", "kforge_tui")
                for path in sorted((ROOT / package).rglob("*.py")) if path != events_module
                for line, text in kind_literals(path.read_text())]
    assert offences == []
