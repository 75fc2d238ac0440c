"""Kill the engine with SIGKILL mid-search, start it again, and check nothing was lost or repeated."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kforge.store import NodeStatus, SessionStatus, Store
from tests.doubles import sample_cards

REPO = Path(__file__).resolve().parents[2]
ITERATIONS = 8


def start_engine(db: Path, sid: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "kforge", "resume", str(sid), "--db", str(db),
                             "--quiet", "--trust-plugins"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


async def digests(store: Store, node_ids) -> dict[int, str]:
    out = {}
    for node_id in node_ids:
        detail = await store.get_node(node_id)
        if detail.candidate is not None:
            out[node_id] = detail.candidate.digest
    return out


async def test_sigkill_then_resume_loses_and_repeats_nothing(tmp_path: Path):
    db, journal = tmp_path / "k.db", tmp_path / "journal.txt"
    store = await Store.open(db)
    settings = {"search": {"proposer": "tests.doubles:make_proposer",
                           "evaluator": "tests.doubles:make_evaluator",
                           "iterations_per_op": ITERATIONS, "parallel": 3, "patience": 1000},
                "fake": {"delay_s": 0.05, "journal": str(journal)}}
    sid = await store.create_profiled_session("toy", settings, {"name": "Fake GPU",
                                                                "arch": "sm_90"}, sample_cards())
    first = start_engine(db, sid)
    deadline = time.monotonic() + 60
    while True:
        nodes = await store.list_nodes(sid)
        finished = [n for n in nodes if not n.in_flight]
        if len(finished) >= 7 and any(n.status == NodeStatus.EVALUATING for n in nodes):
            break
        assert first.poll() is None, first.stdout.read().decode()
        assert time.monotonic() < deadline, "engine made no progress"
        await asyncio.sleep(0.005)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()

    nodes = await store.list_nodes(sid)
    done_before = {n.id: (n.status, n.speedup) for n in nodes if not n.in_flight}
    evaluating = [n.id for n in nodes if n.status == NodeStatus.EVALUATING]
    proposing = [n.id for n in nodes if n.status == NodeStatus.PROPOSING]
    done_digests = await digests(store, done_before)
    pending_digests = await digests(store, evaluating)
    lines_before = len(journal.read_text().splitlines())
    assert (await store.get_session(sid)).status == SessionStatus.RUNNING  # died mid-run

    second = start_engine(db, sid)
    output = second.communicate(timeout=120)[0].decode()
    assert second.returncode == 0, output

    final = {n.id: n for n in await store.list_nodes(sid)}
    assert all(not n.in_flight for n in final.values())
    assert len(final) == ITERATIONS * 3  # the budget, exactly: nothing lost, nothing extra
    for node_id, (status, speedup) in done_before.items():
        if status == NodeStatus.CONFIRMING:  # the resume finishes its confirmation
            assert final[node_id].status != NodeStatus.CONFIRMING
            continue
        assert (final[node_id].status, final[node_id].speedup) == (status, speedup)
    for node_id in proposing:
        assert node_id not in final  # dropped and proposed afresh
    journal_lines = journal.read_text().splitlines()
    ends = [line.split()[1] for line in journal_lines if line.startswith("end")]
    for digest in done_digests.values():
        assert ends.count(digest) == 1  # a completed evaluation is never repeated
    after = journal_lines[lines_before:]
    for node_id, digest in pending_digests.items():
        assert f"end {digest}" in after  # in-flight work is redone
        assert final[node_id].status != NodeStatus.EVALUATING
    session = await store.get_session(sid)
    assert session.status == SessionStatus.DONE and session.engine_pid is None
    await store.close()


import pytest  # noqa: E402


@pytest.mark.parametrize("link", ["logs", "logs/session-1.log", "hard logs/session-1.log",
                                  "fifo logs/session-1.log"])
def test_a_detached_engine_writes_its_log_through_no_link(tmp_path: Path, link):
    """A shared database's folder with a ``logs`` link (or a link of either kind for the
    session's log) to a file such as ~/.bashrc: the engine would append its lines, which quote
    stored text (a crafted card name made one shell-active), there. A pipe there would block."""
    import os

    from kforge.engine.runner import spawn_detached
    from kforge.errors import KforgeError

    kind, _, link = link.rpartition(" ")
    victim = tmp_path / "outside" / "session-1.log"
    victim.parent.mkdir()
    victim.write_text("# mine\n")
    shared = tmp_path / "shared"
    (shared / "logs").mkdir(parents=True) if link != "logs" else shared.mkdir()
    if kind == "hard":
        (shared / link).hardlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(shared / link)
    else:
        (shared / link).symlink_to(victim if link.endswith(".log") else victim.parent)
    message = {"hard": "is a hard link", "fifo": "not a regular file"}.get(kind, "is a link")
    with pytest.raises(KforgeError, match=message):
        spawn_detached(shared / "k.db", 1)
    assert victim.read_text() == "# mine\n"
