"""The session store: schema versions, transactions, events, concurrent access, bad files."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kforge.capture.staging import make_staging, new_staging_dir
from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus, LlmCall, Timing
from kforge.errors import KforgeError
from kforge.store import CardStatus, NodeStatus, SessionStatus, Store
from kforge.store.events import CardUpdated, NodeAdded, NodeFinished, NodeUpdated
from kforge.store.schema import LATEST
from tests.doubles import sample_cards


async def make_session(store: Store) -> int:
    return await store.create_profiled_session("toy", {"dtype": "float16"},
                                               {"name": "H200", "arch": "sm_90"}, sample_cards())


async def test_new_database_is_at_the_latest_schema_in_wal_mode(tmp_path: Path):
    s = await Store.open(tmp_path / "k.db")
    await s.close()
    con = sqlite3.connect(tmp_path / "k.db")
    assert con.execute("PRAGMA user_version").fetchone()[0] == LATEST
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_profiled_session_holds_cards_and_moves_staged_samples(store: Store):
    staging = new_staging_dir(store.samples_root)
    make_staging(staging)
    (staging / "abc").mkdir()
    (staging / "abc" / "0.pt").write_bytes(b"x")
    sid = await store.create_profiled_session("toy", {}, {}, sample_cards(), staging,
                                              modules={sample_cards()[0].key: ["model.attn"]})
    cards = await store.list_cards(sid)
    assert [c.card.short_op for c in cards] == ["_softmax", "add", "relu", "view"]
    assert cards[0].modules == ["model.attn"]
    assert cards[-1].status == CardStatus.SKIPPED and not cards[-1].card.target
    assert (store.samples_dir(sid) / "abc" / "0.pt").read_bytes() == b"x"
    assert not staging.exists()


async def test_node_lifecycle_records_outcome_cost_and_events(store: Store):
    sid = await make_session(store)
    card = (await store.list_cards(sid))[0]
    start = await store.last_seq()
    node = await store.add_node(sid, card.id, None, "new")
    call = LlmCall(model="m", input_tokens=1000, output_tokens=200, usd=0.25, seconds=1.0,
                   prompt="p", reply="r")
    await store.set_candidate(node, Candidate("src", "def launch(k, *a): pass", {"a": 1}), [call])
    outcome = EvalOutcome(EvalStatus.OK, "1.50x", compile_log="ptxas info",
                          timing=Timing(10.0, 9.0, 11.0, 100), speedup=1.5)
    await store.finish_node(node, outcome, 0.405, confirmed=True)
    detail = await store.get_node(node)
    assert detail.row.status == NodeStatus.OK and detail.row.speedup == 1.5
    assert detail.candidate.meta == {"a": 1}
    assert detail.outcome.timing.median_us == 10.0 and detail.outcome.compile_log == "ptxas info"
    assert detail.llm_calls[0]["usd"] == 0.25
    assert (await store.get_session(sid)).usd_spent == 0.25
    assert (await store.get_card(card.id)).best_speedup == 1.5
    records = [e.record for e in await store.events_since(start)]
    assert [type(r) for r in records] == [NodeAdded, NodeUpdated, CardUpdated, NodeFinished]
    assert records[2].changes == {"spent": 1, "best_node": node, "best_speedup": 1.5}
    assert records[3] == NodeFinished(node, card.id, NodeStatus.OK, speedup=1.5)


async def test_an_outcome_stored_with_the_restart_signal_in_extra_reads(tmp_path: Path):
    path = tmp_path / "k.db"
    async with await Store.open(path) as s:
        sid = await make_session(s)
        node = await s.add_node(sid, (await s.list_cards(sid))[0].id, None, "new")
    old = {"status": "crash", "summary": "a kernel crashed", "extra": {"restart": True, "pid": 7}}
    with sqlite3.connect(path) as raw:
        raw.execute("INSERT INTO evaluations (node_id, outcome) VALUES (?, ?)",
                    (node, json.dumps(old)))
    raw.close()
    async with await Store.open(path, create=False) as s:
        outcome = (await s.get_node(node)).outcome
    assert outcome.status is EvalStatus.CRASH and outcome.restart and not outcome.notes


async def test_commands_flow_from_viewer_to_engine(tmp_path: Path):
    engine = await Store.open(tmp_path / "k.db")
    viewer = await Store.open(tmp_path / "k.db", create=False)
    try:
        sid = await make_session(engine)
        await viewer.send_command(sid, "prune", 7)
        pending = await engine.pending_commands(sid)
        assert [(c.kind, c.arg) for c in pending] == [("prune", 7)]
        await engine.ack_command(pending[0].id, "pruned node 7")
        assert await engine.pending_commands(sid) == []
        with pytest.raises(KforgeError, match="no session 99"):
            await viewer.send_command(99, "stop")
    finally:
        await viewer.close()
        await engine.close()


async def test_delete_session_removes_its_rows_and_samples(store: Store):
    sid = await make_session(store)
    store.samples_dir(sid).mkdir(parents=True)
    card = (await store.list_cards(sid))[0]
    await store.add_node(sid, card.id, None, "new")
    await store.delete_session(sid)
    assert await store.list_sessions() == []
    assert await store.list_nodes(sid) == []
    assert not store.samples_dir(sid).exists()


async def test_engine_lease_refuses_a_second_live_engine(store: Store):
    sid = await make_session(store)
    await store.claim_engine(sid)  # this process
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(KforgeError, match="already being searched"):
            await store.claim_engine(sid, pid=sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    await store.release_engine(sid, SessionStatus.STOPPED)
    await store.claim_engine(sid, pid=sleeper.pid)  # a dead process's lease is free again
    session = await store.get_session(sid)
    assert session.engine_pid == sleeper.pid


# ----- bad files -----

async def test_missing_database_is_not_created_by_readers(tmp_path: Path):
    with pytest.raises(KforgeError, match="no kforge database"):
        await Store.open(tmp_path / "nope.db", create=False)
    assert not (tmp_path / "nope.db").exists()


async def test_garbage_file_is_refused_and_left_unchanged(tmp_path: Path):
    path = tmp_path / "k.db"
    path.write_bytes(b"this is not sqlite" * 100)
    before = path.read_bytes()
    with pytest.raises(KforgeError, match="not a kforge database or it is corrupt"):
        await Store.open(path)
    assert path.read_bytes() == before


async def test_an_empty_file_is_not_made_a_database_by_a_command_that_only_reads(tmp_path: Path):
    path = tmp_path / "k.db"
    path.touch()
    with pytest.raises(KforgeError, match="is an empty file, not a kforge database"):
        await Store.open(path, create=False)
    assert path.stat().st_size == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["k.db"]
    async with await Store.open(path) as store:  # a profile may make it one
        await make_session(store)


@pytest.mark.parametrize("opener", ["open", "open_read_only"])
@pytest.mark.parametrize("sql, named", [
    # rewrites what kforge has just checked, as kforge saves it (the plug-ins a session names)
    ("CREATE TRIGGER swap AFTER UPDATE OF settings ON sessions BEGIN UPDATE sessions "
     "SET settings = '{\"search\": {\"proposer\": \"evil:make\"}}' WHERE id = NEW.id; END",
     "trigger 'swap'"),
    ("CREATE VIEW v AS SELECT * FROM sessions", "view 'v'"),
    ("CREATE VIRTUAL TABLE notes USING rtree(id, x0, x1)", "virtual table 'notes'"),
], ids=["trigger", "view", "virtual-table"])
async def test_a_database_with_sql_of_its_own_is_refused_before_it_is_used(tmp_path: Path,
                                                                           opener, sql, named):
    path = tmp_path / "k.db"
    async with await Store.open(path) as store:
        sid = await store.create_profiled_session("toy", {}, {"name": "g"}, [])
    con = sqlite3.connect(path)
    con.execute(sql)
    con.commit()
    con.close()
    with pytest.raises(KforgeError, match=f"not a kforge database: it holds the {named}"):
        store = await getattr(Store, opener)(path)
        await store.update_settings(sid, {"search": {"proposer": "library"}})
    con = sqlite3.connect(path)
    (settings,) = con.execute("SELECT settings FROM sessions").fetchone()
    con.close()
    assert "evil" not in settings


@pytest.mark.parametrize("opener", ["open", "open_read_only"])
@pytest.mark.parametrize("craft, named", [
    # the audit's: a trigger whose type column says 'Trigger' passed a check of the type column
    (["CREATE TRIGGER swap AFTER UPDATE OF settings ON sessions BEGIN UPDATE sessions SET "
      "settings = '{\"search\": {\"proposer\": \"evil:make\"}}' WHERE id = NEW.id; END",
      "PRAGMA writable_schema = ON",
      "UPDATE sqlite_master SET type = 'Trigger' WHERE name = 'swap'"], "trigger 'swap'"),
    (["CREATE/**/VIRTUAL TABLE notes USING rtree(id, x0, x1)"], "virtual table 'notes'"),
    (["create temp view v as select 1"], None),  # lives in the connection only: nothing stored
    (["ALTER TABLE sessions ADD COLUMN big AS (zeroblob(100000000)) VIRTUAL"],
     "table 'sessions' is not the one kforge creates"),
    (["PRAGMA writable_schema = ON",
      "UPDATE sqlite_master SET sql = replace(sql, 'DEFAULT 0', 'DEFAULT (zeroblob(9))') "
      "WHERE name = 'sessions'"], "table 'sessions' is not the one kforge creates"),
    (["CREATE INDEX mine ON nodes (status)"], "index 'mine'"),
], ids=["trigger-typed-Trigger", "virtual-with-comment", "temp",
        "generated-column", "default", "index"])
async def test_only_kforges_exact_schema_opens(tmp_path: Path, opener, craft, named):
    """A schema is compared with the one kforge creates by type, name and SQL (case and comments
    aside), so no object of anyone else's passes, however its type column or SQL is spelled."""
    path = tmp_path / "k.db"
    async with await Store.open(path) as store:
        sid = await store.create_profiled_session("toy", {}, {"name": "g"}, [])
    con = sqlite3.connect(path)
    for statement in craft:
        con.execute(statement)
    con.commit()
    con.close()
    if named is None:
        await (await getattr(Store, opener)(path)).close()
        return
    with pytest.raises(KforgeError, match=f"not a kforge database: it(s| holds the) {named}"):
        store = await getattr(Store, opener)(path)
        await store.update_settings(sid, {"search": {"proposer": "library"}})
    con = sqlite3.connect(path)
    con.execute("PRAGMA writable_schema = ON")
    (settings,) = con.execute("SELECT settings FROM sessions").fetchone()
    con.close()
    assert "evil" not in settings


@pytest.mark.parametrize("craft", [
    ["ALTER TABLE sessions ADD COLUMN big AS (printf('%.*c', 900000000, 'x')) VIRTUAL"],
    ["ALTER TABLE sessions RENAME TO kept",
     "CREATE VIEW sessions AS WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) "
     "SELECT kept.* FROM r, kept", "PRAGMA writable_schema = ON",
     "UPDATE sqlite_master SET type = 'View' WHERE name = 'sessions'"],
], ids=["generated-column", "recursive-view"])
def test_a_crafted_database_does_not_hang_a_reader(tmp_path: Path, craft):
    """The audit's: a small database with a generated column, or with a view over an endless
    recursive query where kforge reads its sessions, hung `kforge sessions`, which grew to
    1.2 GB. It is refused at once, in one line."""
    import time

    path = tmp_path / "k.db"
    asyncio.run(_made(path))
    con = sqlite3.connect(path)
    for statement in craft:
        con.execute(statement)
    con.commit()
    con.close()
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "kforge", "sessions", "--db", str(path)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and result.stderr.count("\n") == 1, result.stderr
    assert "is not a kforge database" in result.stderr
    assert time.monotonic() - started < 120  # seconds where it hung; a start takes one or two


async def _made(path: Path) -> None:
    async with await Store.open(path) as store:
        await make_session(store)


async def test_every_read_is_bounded_in_time_and_rows(store: Store, monkeypatch):
    """A read SQLite has not finished after READ_LIMIT_S is stopped, and a list longer than
    kforge reads at once is refused, each in one line."""
    from kforge.store import connection
    from kforge.store import store as module

    monkeypatch.setattr(connection, "READ_LIMIT_S", 0.2)
    with pytest.raises(KforgeError, match="took longer than 0 s, and was stopped"):
        await store._read("WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r) "
                          "SELECT count(*) FROM r")
    assert len(await store.list_sessions()) == 0  # the connection still serves
    for _ in range(3):
        await make_session(store)
    monkeypatch.setattr(module, "MAX_SESSIONS", 2)
    with pytest.raises(KforgeError, match="holds more than 2 sessions"):
        await store.list_sessions()


@pytest.mark.parametrize("opener", ["open", "open_read_only"])
async def test_a_schema_damaged_into_bytes_that_are_not_text_is_refused(tmp_path: Path, opener):
    """SQLite's message about a damaged schema quotes it; where those bytes are not UTF-8 the
    driver raises UnicodeDecodeError, not an sqlite3 error: still one KforgeError."""
    path = tmp_path / "k.db"
    await (await Store.open(path)).close()
    con = sqlite3.connect(path)
    con.execute("PRAGMA writable_schema = ON")
    con.execute("UPDATE sqlite_master SET sql = CAST(X'435245415445205441424c45207420ac28782920' "
                "AS TEXT) WHERE name = 'sessions'")
    con.commit()
    con.close()
    with pytest.raises(KforgeError, match="not a kforge database or it is corrupt"):
        store = await getattr(Store, opener)(path)  # read-only, the first read finds it
        try:
            await store.list_sessions()
        finally:
            await store.close()


async def test_a_store_says_whether_it_was_opened_read_only(tmp_path: Path):
    path = tmp_path / "k.db"
    async with await Store.open(path) as store:
        assert not store.read_only
    async with await Store.open_to_browse(path) as store:  # this process may write it
        assert not store.read_only
    async with await Store.open_read_only(path) as store:
        assert store.read_only


async def test_foreign_sqlite_file_is_refused(tmp_path: Path):
    path = tmp_path / "other.db"
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE songs (title TEXT)")
    con.commit()
    con.close()
    with pytest.raises(KforgeError, match="not a kforge database"):
        await Store.open(path)
    assert sqlite3.connect(path).execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 1


async def test_newer_schema_is_refused(tmp_path: Path):
    path = tmp_path / "k.db"
    (await Store.open(path)).__class__  # create
    con = sqlite3.connect(path)
    con.execute(f"PRAGMA user_version = {LATEST + 1}")
    con.commit()
    con.close()
    with pytest.raises(KforgeError, match="newer kforge"):
        await Store.open(path)


async def test_folder_instead_of_file_is_refused(tmp_path: Path):
    with pytest.raises(KforgeError, match="is a folder"):
        await Store.open(tmp_path)


async def test_locked_database_gives_a_clear_error(tmp_path: Path):
    path = tmp_path / "k.db"
    s = await Store.open(path, timeout_s=0.2)
    sid = await make_session(s)
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        with pytest.raises(KforgeError, match="locked by another process"):
            await s.set_session_status(sid, SessionStatus.STOPPED)
        assert (await s.get_session(sid)).status == SessionStatus.READY  # reads still work
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        await s.close()


# ----- one writer, several readers, separate processes -----

WRITER = textwrap.dedent("""
    import asyncio, sys
    from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus
    from kforge.store import Store

    async def main(path, sid, card, n):
        s = await Store.open(path)
        for i in range(n):
            node = await s.add_node(sid, card, None, "new")
            await s.set_candidate(node, Candidate(f"src{i}", "l"))
            await s.finish_node(node, EvalOutcome(EvalStatus.OK, speedup=1.0 + i), 0.0)
        await s.close()

    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
""")


async def test_one_writer_and_several_readers_in_other_processes(tmp_path: Path):
    path = tmp_path / "k.db"
    s = await Store.open(path)
    sid = await make_session(s)
    card = (await s.list_cards(sid))[0].id
    start = await s.last_seq()
    n = 60
    writer = await asyncio.create_subprocess_exec(sys.executable, "-c", WRITER, str(path),
                                                  str(sid), str(card), str(n))
    readers = [await Store.open(path, create=False) for _ in range(3)]

    async def tail(reader: Store) -> list[int]:
        seen, seq = [], start
        while True:
            for event in await reader.events_since(seq, session_id=sid):
                seq = event.seq
                if isinstance(event.record, NodeFinished):
                    # every event a reader sees refers to fully committed state
                    detail = await reader.get_node(event.record.node_id)
                    assert detail.row.status == NodeStatus.OK
                    assert detail.outcome is not None
                    seen.append(event.record.node_id)
            if len(seen) == n:
                return seen
            await asyncio.sleep(0.01)

    try:
        results = await asyncio.wait_for(asyncio.gather(*(tail(r) for r in readers)), 60)
        assert await writer.wait() == 0
    finally:
        for r in readers:
            await r.close()
    for seen in results:
        assert seen == sorted(seen) and len(set(seen)) == n
    events = await s.events_since(start, session_id=sid)
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    assert (await s.get_card(card)).spent == n
    await s.close()


async def test_a_read_cancelled_at_any_point_leaves_the_connection_on_fresh_data(tmp_path: Path):
    db = tmp_path / "k.db"
    async with await Store.open(db) as writer, await Store.open_to_browse(db) as viewer:
        sid = await make_session(writer)
        for pause in range(12):  # cancel after 0, 1, ... turns of the event loop
            read = asyncio.ensure_future(viewer.list_sessions())
            for _ in range(pause):
                await asyncio.sleep(0)
            read.cancel()
            await asyncio.gather(read, return_exceptions=True)
            await writer.set_session_status(sid, SessionStatus.STOPPED if pause % 2
                                            else SessionStatus.RUNNING)
            (summary,) = await viewer.list_sessions()
            assert summary.session.status == (SessionStatus.STOPPED if pause % 2
                                              else SessionStatus.RUNNING)


async def test_the_bests_of_a_database_from_before_confirmation_flags_count_as_confirmed(
        tmp_path: Path):
    path = tmp_path / "old.db"
    store = await Store.open(path)
    try:
        sid = await store.create_profiled_session("toy", {}, {}, sample_cards())
        card = (await store.list_cards(sid))[0].id
        best, other = [await store.add_node(sid, card, None, "new") for _ in range(2)]
    finally:
        await store.close()
    con = sqlite3.connect(path)  # as an older kforge left it: a best, no confirmation flags
    con.execute("UPDATE op_cards SET best_node = ?, best_speedup = 2.0 WHERE id = ?",
                (best, card))
    con.execute("ALTER TABLE nodes DROP COLUMN confirmed")
    con.execute(f"PRAGMA user_version = {LATEST - 1}")
    con.commit()
    con.close()
    store = await Store.open(path)
    try:
        nodes = {n.id: n for n in await store.list_nodes(sid)}
    finally:
        await store.close()
    assert nodes[best].confirmed and not nodes[other].confirmed


# ----- links beside a database -----


@pytest.mark.parametrize("kind", ["symbolic", "hard"])
@pytest.mark.parametrize("name", ["k.db-wal", "k.db-shm", "k.db-journal"])
async def test_a_link_where_sqlite_keeps_its_files_is_refused(tmp_path: Path, name, kind):
    """A shared database's folder (an unpacked archive) may hold a link of either kind where
    SQLite writes its log or its shared memory: a hard-linked k.db-shm had `kforge sessions`
    write 32 KiB of wal-index into the user's own file."""
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    shared = tmp_path / "shared"
    shared.mkdir()
    async with await Store.open(shared / "k.db") as store:
        await make_session(store)
    (shared / name).unlink(missing_ok=True)
    if kind == "hard":
        (shared / name).hardlink_to(victim)
    else:
        (shared / name).symlink_to(victim)
    for opening in (Store.open, Store.open_read_only, Store.open_to_browse):
        with pytest.raises(KforgeError, match="is a link" if kind == "symbolic" else
                           f"{name} is a hard link \\(2 names for one file\\)"):
            await opening(shared / "k.db")
    assert victim.read_text() == "mine\n"
    result = subprocess.run([sys.executable, "-m", "kforge", "sessions", "--db",
                             str(shared / "k.db")], capture_output=True, text=True)
    assert result.returncode == 1 and result.stderr.count("\n") == 1 and name in result.stderr
    assert victim.read_text() == "mine\n"


@pytest.mark.parametrize("kind", ["symbolic", "hard"])
async def test_a_database_that_is_a_link_is_refused(tmp_path: Path, kind):
    """The database is a file SQLite writes too: a second name of one of the user's files, or a
    link to one, is not opened."""
    shared = tmp_path / "shared"
    shared.mkdir()
    async with await Store.open(tmp_path / "real.db") as store:
        await make_session(store)
    if kind == "hard":
        (shared / "k.db").hardlink_to(tmp_path / "real.db")
    else:
        (shared / "k.db").symlink_to(tmp_path / "real.db")
    before = (tmp_path / "real.db").read_bytes()
    for opening in (Store.open, Store.open_read_only, Store.open_to_browse):
        with pytest.raises(KforgeError, match="k.db is a (hard )?link"):
            await opening(shared / "k.db")
    assert (tmp_path / "real.db").read_bytes() == before
    assert sorted(p.name for p in shared.iterdir()) == ["k.db"]


async def test_a_samples_link_beside_the_database_leads_nowhere(tmp_path: Path):
    """Neither a samples folder nor a session's folder in it that is a link is written into or
    removed under."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "1").mkdir(parents=True)
    (elsewhere / "1" / "keep.txt").write_text("mine")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "samples").symlink_to(elsewhere, target_is_directory=True)
    async with await Store.open(shared / "k.db") as store:
        sid = await make_session(store)
        with pytest.raises(KforgeError, match="is a link"):
            new_staging_dir(store.samples_root)
        with pytest.raises(KforgeError, match="is a link"):
            await store.delete_session(sid)
        assert (await store.get_session(sid)).id == sid  # nothing deleted
        (shared / "samples").unlink()
        (shared / "samples").mkdir()
        (shared / "samples" / "k.db").symlink_to(elsewhere, target_is_directory=True)
        with pytest.raises(KforgeError, match="is a link"):
            store.samples_dir(sid)
        (shared / "samples" / "k.db").unlink()
        (shared / "samples" / "k.db").mkdir()
        (shared / "samples" / "k.db" / str(sid)).symlink_to(elsewhere / "1",
                                                            target_is_directory=True)
        with pytest.raises(KforgeError, match="is a link"):
            store.samples_dir(sid)
        with pytest.raises(KforgeError, match="is a link"):
            await store.delete_session(sid)
        (shared / "samples" / "k.db" / str(sid)).unlink()
        (shared / "samples" / str(sid)).symlink_to(elsewhere / "1", target_is_directory=True)
        assert store.samples_to_read(sid) == store.samples_dir(sid)  # an old folder's link
    assert (elsewhere / "1" / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in elsewhere.rglob("*")) == ["1", "keep.txt"]
