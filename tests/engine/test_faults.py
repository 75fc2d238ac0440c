"""Searches under injected faults: another process holding the write lock, engines killed
(SIGKILL) or stopped (SIGTERM) at random points and resumed, 1-4 proposals in parallel, viewers
reading while the engine writes, and read-only database files.

Each scenario draws its fault points from ``random.Random(seed)`` and, once the search has run to
its end, checks the same things: nothing lost (a node finished before a fault keeps its outcome),
nothing repeated (no finished node is evaluated again), one engine per session, and each card's
bookkeeping equal to what its nodes say. Time is scaled down: the engine's busy timeout is a
fraction of a second, so a lock held a second or more outlasts it many times over.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kforge.core.settings import SearchSettings
from kforge.engine.engine import Engine
from kforge.errors import KforgeError
from kforge.store import NodeStatus, SessionStatus, Store
from kforge.store import connection as connection_module
from kforge.store.events import EngineAttached, SessionStatusChanged
from tests.doubles import FakeEvaluator, FakeProposer, sample_cards

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
ITERATIONS = 6
TARGET_OPS = 3
BUSY_TIMEOUT_S = 0.25  # the engine store's busy timeout, scaled down from its 5 s default
SEEDS = (3, 17, 2024)
KILL_SCENARIOS = [(3, 1), (17, 2), (2024, 3), (99, 4)]  # (seed, proposals in parallel)

# Another process (a backup, an sqlite3 shell) takes the write lock and keeps it a while.
HOLDER = """
import sqlite3, sys, time
con = sqlite3.connect(sys.argv[1], isolation_level=None)
con.execute("BEGIN IMMEDIATE")
print("held", flush=True)
time.sleep(float(sys.argv[2]))
con.execute("ROLLBACK")
"""


# ----- what must hold after every scenario -----


async def finished_outcomes(store: Store, sid: int) -> dict[int, tuple[str, float | None, str]]:
    """Each finished node's status, speedup and candidate digest (None without a candidate)."""
    out = {}
    for node in await store.list_nodes(sid):
        if not node.in_flight:
            detail = await store.get_node(node.id)
            digest = detail.candidate.digest if detail.candidate else None
            out[node.id] = (node.status, node.speedup, digest)
    return out


def journal_lines(journal: Path) -> list[str]:
    return journal.read_text().splitlines() if journal.exists() else []


async def assert_search_whole(store: Store, sid: int, journal: Path,
                              done_before: dict[int, tuple[str, float | None, str]],
                              journal_before: int) -> None:
    session = await store.get_session(sid)
    assert session.status == SessionStatus.DONE and session.engine_pid is None
    nodes = await store.list_nodes(sid)
    assert len(nodes) == ITERATIONS * TARGET_OPS  # the budget exactly: nothing lost or extra
    assert not any(n.in_flight for n in nodes)
    final = await finished_outcomes(store, sid)
    assert not any(n.confirming for n in nodes)  # every would-be best has its verdict
    for node_id, outcome in done_before.items():
        if outcome[0] == NodeStatus.CONFIRMING:  # evaluated, its confirmation's verdict since
            assert final[node_id][2] == outcome[2]
        else:
            assert final[node_id] == outcome  # nothing lost
    after = journal_lines(journal)[journal_before:]
    for _, _, digest in done_before.values():
        if digest is not None:  # nothing repeated: a finished node is never evaluated again
            assert f"start {digest}" not in after
    ends = [line.split()[1] for line in journal_lines(journal) if line.startswith("end")]
    for status, _, digest in final.values():
        if digest is not None and status != NodeStatus.NO_CANDIDATE:
            assert digest in ends  # every stored result came from a finished evaluation
    await assert_bookkeeping(store, sid)


async def assert_bookkeeping(store: Store, sid: int) -> None:
    nodes = await store.list_nodes(sid)
    for row in await store.list_cards(sid):
        finished = [n for n in nodes if n.card_id == row.id and not n.in_flight]
        assert row.spent == len(finished)
        speeds = [n.speedup for n in finished if n.confirmed]
        assert row.best_speedup == (max(speeds) if speeds else None)
        if speeds:
            best = next(n for n in finished if n.id == row.best_node)
            assert best.status == NodeStatus.OK and best.speedup == max(speeds)
        else:
            assert row.best_node is None


# ----- sessions, engines and other processes -----


def fake_settings(rng: random.Random, journal: Path, parallel: int) -> dict:
    return {"search": {"proposer": "tests.doubles:make_proposer",
                       "evaluator": "tests.doubles:make_evaluator",
                       "iterations_per_op": ITERATIONS, "parallel": parallel,
                       "patience": 1000, "seed": rng.randrange(10_000)},
            "fake": {"delay_s": 0.03, "journal": str(journal),
                     "fail_every": rng.choice([0, 4])}}


async def new_session(store: Store, settings: dict) -> int:
    return await store.create_profiled_session("toy", settings, {"name": "Fake GPU",
                                                                 "arch": "sm_90"}, sample_cards())


def start_engine(db: Path, sid: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "kforge", "resume", str(sid), "--db", str(db),
                             "--quiet", "--trust-plugins"], cwd=REPO, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def start_reader(db: Path, sid: int) -> subprocess.Popen:
    """A viewer in another process that reads the session until its search has ended."""
    return subprocess.Popen([sys.executable, "-m", "tests.engine.test_faults", str(db), str(sid)],
                            cwd=REPO, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def reader_report(reader: subprocess.Popen) -> dict:
    out, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, err.decode()
    return json.loads(out)


async def read_until_ended(db: Path, sid: int) -> dict:
    """Browse the session as a viewer does while the engine writes; each card's count, read in
    one statement with its nodes, must agree with them and must never go down."""
    reads, spent_seen = 0, {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        store = await Store.open_read_only(db)
        try:
            summaries = await store.list_sessions()
            rows = await store._read(
                "SELECT c.id, c.spent, (SELECT count(*) FROM nodes n WHERE n.card_id = c.id "
                "AND n.finished_at IS NOT NULL) AS finished FROM op_cards c "
                "WHERE c.session_id = ?", (sid,))
            await store.list_cards(sid)
            await store.events_since(0, session_id=sid)
            for row in rows:
                assert row["spent"] == row["finished"], dict(row)
                assert row["spent"] >= spent_seen.get(row["id"], 0)
                spent_seen[row["id"]] = row["spent"]
            reads += 1
            status = next(s.session.status for s in summaries if s.session.id == sid)
        finally:
            await store.close()
        if status == SessionStatus.DONE:
            return {"reads": reads, "spent": sum(spent_seen.values())}
        await asyncio.sleep(0.01)
    raise AssertionError("the search did not end while the reader watched")


async def wait_for(condition, what: str, proc: subprocess.Popen | None = None,
                   timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not await condition():
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"engine ended before {what}: {proc.stdout.read().decode()}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)


async def claim_is_refused_or_came_after_release(store: Store, sid: int) -> None:
    """A second claim while the engine is live must be refused; one that succeeds must have come
    after the engine released the session."""
    try:
        await store.claim_engine(sid, pid=os.getpid())
    except KforgeError as exc:
        assert "already being searched" in str(exc)
        return
    records = [e.record for e in await store.events_since(0, session_id=sid)]
    ours = max(i for i, r in enumerate(records) if isinstance(r, EngineAttached))
    released = [r for r in records[:ours] if isinstance(r, SessionStatusChanged)]
    assert released and released[-1].status == SessionStatus.DONE
    await store.release_engine(sid, SessionStatus.DONE)


# ----- the scenarios -----


@pytest.mark.parametrize(("seed", "parallel"), KILL_SCENARIOS)
@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
async def test_an_engine_killed_or_stopped_at_a_random_point_resumes_losing_nothing(
        tmp_path: Path, seed: int, parallel: int, fault: signal.Signals):
    rng = random.Random(seed * 31 + fault)
    db, journal, hold = tmp_path / "k.db", tmp_path / "journal.txt", tmp_path / "hold"
    store = await Store.open(db)
    try:
        settings = fake_settings(rng, journal, parallel)
        kill_after = rng.randint(1, ITERATIONS * TARGET_OPS // 2)
        kill_mid_evaluation = rng.random() < 0.5
        # The first engine stops at the kill point until killed, however loaded the machine:
        # its evaluator (or proposer) holds every call after the kill point's.
        hold.touch()
        settings["fake"]["hold"] = {"path": str(hold), "after": kill_after,
                                    "in": "evaluate" if kill_mid_evaluation else "propose"}
        sid = await new_session(store, settings)
        first = start_engine(db, sid)

        async def at_kill_point() -> bool:
            nodes = await store.list_nodes(sid)
            finished = sum(not n.in_flight for n in nodes)
            evaluating = any(n.status == NodeStatus.EVALUATING for n in nodes)
            return finished >= kill_after and evaluating == kill_mid_evaluation

        await wait_for(at_kill_point, "the kill point", first)
        os.kill(first.pid, fault)
        first.communicate(timeout=60)
        hold.unlink()  # the resumed engine runs freely
        session = await store.get_session(sid)
        if fault == signal.SIGTERM:  # a clean stop: the lease is given back
            assert first.returncode == 0
            assert session.status == SessionStatus.STOPPED and session.engine_pid is None
        else:
            assert session.status == SessionStatus.RUNNING and session.engine_pid == first.pid
        await assert_bookkeeping(store, sid)
        done_before = await finished_outcomes(store, sid)
        journal_before = len(journal_lines(journal))

        second, reader = start_engine(db, sid), start_reader(db, sid)

        async def second_claimed() -> bool:
            return (await store.get_session(sid)).engine_pid == second.pid

        await wait_for(second_claimed, "the resumed engine's claim", second)
        await claim_is_refused_or_came_after_release(store, sid)
        output = second.communicate(timeout=120)[0].decode()
        assert second.returncode == 0, output
        assert reader_report(reader)["spent"] == ITERATIONS * TARGET_OPS
        await assert_search_whole(store, sid, journal, done_before, journal_before)
    finally:
        await store.close()


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("hold_s", [0.1, 0.6, 1.5])  # shorter and far longer than busy timeout
async def test_a_search_outlasts_a_lock_holder_while_viewers_read(
        tmp_path: Path, monkeypatch, seed: int, hold_s: float):
    monkeypatch.setattr(connection_module, "LOCK_BACKOFF_S", (0.02, 0.2))
    rng = random.Random(seed * 7 + int(hold_s * 10))
    db, journal = tmp_path / "k.db", tmp_path / "journal.txt"
    store = await Store.open(db, timeout_s=BUSY_TIMEOUT_S)
    try:
        settings = fake_settings(rng, journal, parallel=rng.randint(1, 4))
        sid = await new_session(store, settings)
        fake = settings["fake"]
        engine = Engine(store, sid,
                        FakeProposer(fail_every=fake["fail_every"]),
                        FakeEvaluator(delay_s=fake["delay_s"], journal=fake["journal"]),
                        SearchSettings.from_dict(settings["search"]))
        reader = start_reader(db, sid)
        run = asyncio.create_task(engine.run())
        lock_after = rng.randint(0, ITERATIONS * TARGET_OPS // 2)

        async def at_lock_point() -> bool:
            nodes = await store.list_nodes(sid)
            return sum(not n.in_flight for n in nodes) >= lock_after

        await wait_for(at_lock_point, "the lock point")
        done_before = await finished_outcomes(store, sid)
        journal_before = len(journal_lines(journal))
        holder = await asyncio.create_subprocess_exec(sys.executable, "-c", HOLDER, str(db),
                                                      str(hold_s), stdout=asyncio.subprocess.PIPE)
        assert await holder.stdout.readline() == b"held\n"
        # still to write (at least its release), the engine meets the lock for about hold_s
        must_wait = not run.done() and hold_s > 4 * BUSY_TIMEOUT_S
        async with await Store.open(db) as other:  # waits out the holder, then is refused
            await claim_is_refused_or_came_after_release(other, sid)
        assert await asyncio.wait_for(run, 60) == SessionStatus.DONE
        assert await holder.wait() == 0
        assert reader_report(reader)["spent"] == ITERATIONS * TARGET_OPS
        await assert_search_whole(store, sid, journal, done_before, journal_before)
        if must_wait:
            said = [e.record.message for e in await store.recent_logs(sid)]
            assert any("waited" in line and "write lock" in line for line in said)
    finally:
        await store.close()


async def test_a_read_only_database_is_browsed_and_refuses_writes_with_one_message(
        tmp_path: Path):
    db, journal = tmp_path / "k.db", tmp_path / "journal.txt"
    async with await Store.open(db) as store:
        sid = await new_session(store, fake_settings(random.Random(5), journal, parallel=2))
    engine = start_engine(db, sid)
    output = engine.communicate(timeout=120)[0].decode()
    assert engine.returncode == 0, output
    db.chmod(0o444)
    try:
        viewer = await Store.open_read_only(db)
        try:
            [summary] = await viewer.list_sessions()
            assert summary.nodes == ITERATIONS * TARGET_OPS
            await assert_bookkeeping(viewer, sid)
            assert await viewer.events_since(0, session_id=sid)
            for write in (viewer.log(sid, "hello"), viewer.claim_engine(sid),
                          viewer.set_session_status(sid, SessionStatus.STOPPED)):
                with pytest.raises(KforgeError) as caught:
                    await write
                message = str(caught.value)
                assert str(db) in message and "readonly" in message and "\n" not in message
        finally:
            await viewer.close()
    finally:
        db.chmod(0o644)


if __name__ == "__main__":  # the reader process of the scenarios above
    print(json.dumps(asyncio.run(read_until_ended(Path(sys.argv[1]), int(sys.argv[2])))))
