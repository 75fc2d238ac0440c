"""The engine beside other processes: it waits out a held write lock, keeps beating through
errors, refuses a session another engine searches, and stops writing once its lease is taken."""

from __future__ import annotations

import asyncio
import sys

import pytest

from kforge.core.settings import SearchSettings
from kforge.engine import engine as engine_module
from kforge.engine.engine import Engine
from kforge.errors import KforgeError
from kforge.store import NodeStatus, SessionStatus, Store
from kforge.store import lease as lease_module
from kforge.store.events import CommandDone
from tests.doubles import FakeEvaluator, FakeProposer
from tests.engine.test_engine import session
from tests.store.test_commands import dead_pid

ITERATIONS = 4
TARGET_OPS = 3

# Another process (a backup, an sqlite3 shell) takes the write lock and keeps it a while.
HOLDER = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN IMMEDIATE")
print("held", flush=True)
time.sleep(float(sys.argv[2]))
con.execute("ROLLBACK")
"""


class GatedEvaluator(FakeEvaluator):
    """Evaluates only once the gate is open, so a test can act while a search is under way."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.waiting = 0

    async def evaluate(self, card, candidate):
        self.waiting += 1
        await self.gate.wait()
        return await super().evaluate(card, candidate)


def engine(store: Store, sid: int, evaluator: FakeEvaluator) -> Engine:
    return Engine(store, sid, FakeProposer(), evaluator, SearchSettings.from_dict(
        {"iterations_per_op": ITERATIONS, "parallel": 2, "patience": 100}))


async def under_way(evaluator: GatedEvaluator) -> None:
    """Until the engine has claimed the session and a candidate waits to be judged."""
    while not evaluator.waiting:
        await asyncio.sleep(0.01)


async def all_finished(store: Store, sid: int) -> None:
    nodes = await store.list_nodes(sid)
    assert len(nodes) == ITERATIONS * TARGET_OPS
    assert all(n.status == NodeStatus.OK for n in nodes)
    session_row = await store.get_session(sid)
    assert session_row.status == SessionStatus.DONE and session_row.engine_pid is None


async def test_a_search_waits_out_another_process_holding_the_write_lock(store: Store):
    sid = await session(store)
    evaluator = GatedEvaluator()
    run = asyncio.create_task(engine(store, sid, evaluator).run())
    await under_way(evaluator)
    holder = await asyncio.create_subprocess_exec(sys.executable, "-c", HOLDER, str(store.path),
                                                  "6.5", stdout=asyncio.subprocess.PIPE)
    assert await holder.stdout.readline() == b"held\n"
    evaluator.gate.set()  # the engine's next write meets the lock, for longer than busy_timeout
    assert await asyncio.wait_for(run, 60) == SessionStatus.DONE
    assert await holder.wait() == 0
    await all_finished(store, sid)
    said = [e.record.message for e in await store.recent_logs(sid)]
    assert any("waited" in line and "write lock" in line for line in said)


async def test_the_heartbeat_survives_an_error(store: Store, monkeypatch):
    monkeypatch.setattr(engine_module, "HEARTBEAT_S", 0.02)
    sid = await session(store)
    beats: list[float] = []
    real_beat = store.heartbeat

    async def flaky_beat(session_id: int, run_seconds: float) -> None:
        beats.append(run_seconds)
        if len(beats) == 1:
            raise KforgeError(f"database {store.path} is locked by another process")
        await real_beat(session_id, run_seconds)

    monkeypatch.setattr(store, "heartbeat", flaky_beat)
    evaluator = GatedEvaluator()
    run = asyncio.create_task(engine(store, sid, evaluator).run())

    async def five_beats() -> None:
        while len(beats) < 5:
            await asyncio.sleep(0.02)

    await asyncio.wait_for(five_beats(), 5)
    beaten = (await store.get_session(sid)).heartbeat_at
    await asyncio.sleep(0.1)
    assert (await store.get_session(sid)).heartbeat_at > beaten  # still beating
    evaluator.gate.set()
    assert await asyncio.wait_for(run, 30) == SessionStatus.DONE
    assert beats == sorted(beats)  # the session's searched time only grows


async def test_a_second_engine_is_refused_while_one_searches(store: Store):
    sid = await session(store)
    evaluator = GatedEvaluator()
    first = asyncio.create_task(engine(store, sid, evaluator).run())
    await under_way(evaluator)
    other = await Store.open(store.path)
    try:
        seq = await other.last_seq()
        with pytest.raises(KforgeError, match="already being searched"):
            await engine(other, sid, FakeEvaluator()).run()
        assert all(e.record.__class__.__name__ != "EngineAttached"
                   for e in await other.events_since(seq, session_id=sid))
    finally:
        await other.close()
    evaluator.gate.set()
    assert await asyncio.wait_for(first, 30) == SessionStatus.DONE
    await all_finished(store, sid)


async def test_an_engine_whose_lease_is_taken_over_stops_writing_at_once(store: Store,
                                                                          monkeypatch):
    sid = await session(store)
    evaluator = GatedEvaluator()
    run = asyncio.create_task(engine(store, sid, evaluator).run())
    await under_way(evaluator)
    other = await Store.open(store.path)
    try:
        # an engine on another host found this one's heartbeat stale and took the session
        monkeypatch.setattr(lease_module, "engine_alive", lambda *_: False)
        await other.claim_engine(sid, pid=4343, host="elsewhere")
        seq = await other.last_seq()
        evaluator.gate.set()
        with pytest.raises(KforgeError, match="no longer searched by this engine"):
            await asyncio.wait_for(run, 30)
        assert await other.events_since(seq) == []  # nothing written after the takeover
        session_row = await other.get_session(sid)
        assert (session_row.engine_pid, session_row.engine_host) == (4343, "elsewhere")
    finally:
        await other.close()


async def test_a_resume_ignores_a_stop_or_pause_its_dead_predecessor_never_read(store: Store):
    """`kforge stop` (or the TUI's pause) reached the queue of an engine that was killed before
    it read it: the resumed search must run, not stop or pause at once. A focus sent to the dead
    engine still counts: the next engine carries it out."""
    sid = await session(store)
    relu = next(c for c in await store.list_cards(sid) if c.card.op == "aten.relu.default")
    await store.claim_engine(sid, pid=dead_pid())
    await store.set_session_status(sid, SessionStatus.RUNNING)
    sent = {await store.send_command(sid, kind, arg): kind
            for kind, arg in (("pause", None), ("stop", None), ("focus", relu.id))}
    assert await engine(store, sid, FakeEvaluator()).run() == SessionStatus.DONE
    await all_finished(store, sid)
    results = {e.record.command_id: e.record.result for e in await store.events_since(0, sid)
               if isinstance(e.record, CommandDone)}
    assert set(results) == set(sent)  # each answered once
    for command_id, kind in sent.items():
        if kind == "focus":
            assert results[command_id].startswith("focused on relu")
        else:
            assert "not carried out" in results[command_id]
