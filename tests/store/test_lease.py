"""The store under other processes' locks and engines: durability, cancelled transactions, waiting
out a lock, the engine lease's fencing and how a live engine is told from a dead one."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kforge.errors import KforgeError
from kforge.store import CommandKind, SessionStatus, Store
from kforge.store import lease as lease_module
from kforge.store.commands import is_alive, issue
from kforge.store.lease import LeaseLost, engine_alive
from tests.doubles import sample_cards


async def make_session(store: Store) -> int:
    return await store.create_profiled_session("toy", {}, {"name": "H200", "arch": "sm_90"},
                                               sample_cards())


@pytest.fixture
def sleeper():
    """A live process on this host that is not this one."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def hold_write_lock(path: Path, seconds: float) -> threading.Event:
    """Hold the database's write lock from another connection for ``seconds``; the event is set
    once it is held."""
    held = threading.Event()

    def hold() -> None:
        con = sqlite3.connect(path, isolation_level=None)
        con.execute("BEGIN IMMEDIATE")
        held.set()
        time.sleep(seconds)
        con.execute("ROLLBACK")
        con.close()

    threading.Thread(target=hold, daemon=True).start()
    assert held.wait(5)
    return held


async def test_commits_are_durable_on_power_loss(store: Store):
    rows = await store._read("PRAGMA synchronous")
    assert rows[0][0] == 2  # FULL


async def test_a_cancelled_transaction_always_rolls_back(store: Store):
    sid = await make_session(store)
    rng = random.Random(13)
    for i in range(400):
        write = asyncio.create_task(store.log(sid, f"line {i}"))
        for _ in range(rng.randrange(8)):
            await asyncio.sleep(0)
        write.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await write
    await store.set_session_status(sid, SessionStatus.STOPPED)  # a normal write works
    assert (await store.get_session(sid)).status == SessionStatus.STOPPED
    other = sqlite3.connect(store.path, isolation_level=None, timeout=0)
    other.execute("BEGIN IMMEDIATE")  # and the write lock was not left held
    other.execute("ROLLBACK")
    other.close()


async def test_an_engine_store_waits_out_another_process_lock_and_says_so(tmp_path: Path):
    store = await Store.open(tmp_path / "k.db", timeout_s=0.2)
    try:
        sid = await make_session(store)
        await store.claim_engine(sid)
        hold_write_lock(store.path, 1.0)
        started = time.monotonic()
        await store.set_session_status(sid, SessionStatus.RUNNING)
        assert time.monotonic() - started >= 0.5
        assert (await store.get_session(sid)).status == SessionStatus.RUNNING
        said = [e.record.message for e in await store.recent_logs(sid)]
        assert any("waited" in line and "write lock" in line for line in said)
    finally:
        await store.close()


async def test_a_store_whose_lease_was_taken_over_stops_writing(tmp_path: Path, monkeypatch):
    path = tmp_path / "k.db"
    first, second = await Store.open(path), await Store.open(path)
    try:
        sid = await make_session(first)
        await first.claim_engine(sid, pid=4242, host="far-away")
        monkeypatch.setattr(lease_module, "ENGINE_STALE_S", 0.0)  # its heartbeat looks stale
        await second.claim_engine(sid, pid=4343, host="elsewhere")
        seq = await second.last_seq()
        for write in (first.log(sid, "still here"), first.heartbeat(sid, 1.0),
                      first.release_engine(sid, SessionStatus.STOPPED)):
            with pytest.raises(LeaseLost, match="process 4343 on elsewhere"):
                await write
        assert await second.events_since(seq) == []
        session = await second.get_session(sid)
        assert (session.engine_pid, session.engine_host) == (4343, "elsewhere")
        await second.heartbeat(sid, 1.0)  # the new holder writes on
    finally:
        await first.close()
        await second.close()


async def test_a_second_store_cannot_claim_a_session_this_process_searches(tmp_path: Path):
    path = tmp_path / "k.db"
    first, second = await Store.open(path), await Store.open(path)
    try:
        sid = await make_session(first)
        await first.claim_engine(sid)
        with pytest.raises(KforgeError, match="already being searched"):
            await second.claim_engine(sid)
    finally:
        await first.close()
        await second.close()


async def test_a_live_engine_on_this_host_is_alive_however_late_its_heartbeat(
        store: Store, sleeper, monkeypatch):
    sid = await make_session(store)
    await store.claim_engine(sid, pid=sleeper.pid)
    monkeypatch.setattr(lease_module, "ENGINE_STALE_S", 0.05)
    await asyncio.sleep(0.1)  # its heartbeat is now stale
    viewer = await Store.open(store.path, create=False)
    try:
        assert is_alive(await viewer.get_session(sid))
        said = await issue(viewer, sid, CommandKind.STOP)
        assert said.startswith(f"asked the engine of session {sid} (process {sleeper.pid})")
        (queued,) = await viewer.pending_commands(sid)
        assert queued.kind == CommandKind.STOP
    finally:
        await viewer.close()


def test_a_process_started_after_the_last_heartbeat_only_reuses_the_pid(sleeper):
    assert engine_alive(sleeper.pid, socket.gethostname(), time.time())
    assert not engine_alive(sleeper.pid, socket.gethostname(), time.time() - 3600)


def test_an_engine_on_another_host_is_judged_by_its_heartbeat():
    assert engine_alive(4242, "far-away", time.time())
    assert not engine_alive(4242, "far-away", time.time() - lease_module.ENGINE_STALE_S - 1)
    assert not engine_alive(4242, "far-away", None)



@pytest.mark.parametrize("pid", [0, -1, 2**62])
def test_a_stored_pid_no_process_can_have_is_no_engine(pid: int):
    """0 and -1 would name process groups (os.kill(-1, 0) succeeds), 2**62 overflows os.kill:
    none is an engine here, whatever the heartbeat says."""
    assert not engine_alive(pid, socket.gethostname(), time.time())
