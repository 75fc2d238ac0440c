"""The `kforge` command line: listings, a search through test doubles, detach/stop, bad input."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kforge.cli.main import main
from kforge.store import SessionStatus, Store
from tests.doubles import sample_cards

REPO = Path(__file__).resolve().parents[2]
DOUBLES = ["--proposer", "tests.doubles:make_proposer",
           "--evaluator", "tests.doubles:make_evaluator"]


def make_db(path: Path, settings: dict | None = None) -> int:
    async def go() -> int:
        store = await Store.open(path)
        try:
            return await store.create_profiled_session(
                "toy", settings or {}, {"name": "Fake GPU", "arch": "sm_90"}, sample_cards())
        finally:
            await store.close()

    return asyncio.run(go())


def kforge(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "kforge", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def one_error_line(result) -> str:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("kforge: ")
    return lines[0]


def test_sessions_without_a_database_creates_nothing(tmp_path: Path, capsys):
    db = tmp_path / "k.db"
    assert main(["sessions", "--db", str(db)]) == 0
    assert "no sessions yet" in capsys.readouterr().out
    assert not db.exists()


def test_search_through_doubles_then_show_and_sessions(tmp_path: Path, capsys):
    db = tmp_path / "k.db"
    sid = make_db(db)
    assert main(["search", "--session", str(sid), "--db", str(db), "--iterations", "3",
                 "--quiet", *DOUBLES]) == 0
    assert main(["show", str(sid), "--db", str(db)]) == 0
    shown = capsys.readouterr().out
    assert "_softmax" in shown and "f16[8,1024], -1, False" in shown
    assert "view" in shown  # views are listed, not searched
    assert main(["sessions", "--db", str(db)]) == 0
    listed = capsys.readouterr().out
    assert "toy" in listed and "done" in listed and "Fake GPU (sm_90)" in listed


def test_search_settings_persist_for_resume(tmp_path: Path):
    db = tmp_path / "k.db"
    sid = make_db(db)
    assert main(["search", "--session", str(sid), "--db", str(db), "--iterations", "1",
                 "--usd", "2.5", "--quiet", *DOUBLES]) == 0
    assert main(["resume", str(sid), "--db", str(db), "--quiet", "--iterations", "2"]) == 0

    async def check():
        store = await Store.open(db)
        try:
            session = await store.get_session(sid)
            return session.settings["search"], len(await store.list_nodes(sid))
        finally:
            await store.close()

    search, nodes = asyncio.run(check())
    assert search["usd"] == 2.5 and search["proposer"] == "tests.doubles:make_proposer"
    assert search["iterations_per_op"] == 2 and nodes == 6


@pytest.mark.parametrize("args, message", [
    (["show", "42"], "no session 42"),
    (["resume", "42"], "no session 42"),
    (["stop", "1"], "is not running"),
    (["search", "--session", "1", "--time", "soon"], "cannot read 'soon' as a duration"),
    (["search", "--session", "1", "--proposer", "nosuch.module:f"], "cannot import"),
    (["search", "--session", "1", "--iterations", "0"], "at least 1"),
])
def test_bad_input_gives_one_clear_line_and_changes_nothing(tmp_path: Path, args, message):
    db = tmp_path / "k.db"
    make_db(db)
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    result = kforge(*args, "--db", str(db))
    assert message in one_error_line(result)
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest


def test_corrupt_database_file_is_reported_and_untouched(tmp_path: Path):
    db = tmp_path / "k.db"
    db.write_bytes(b"\x00garbage" * 512)
    before = db.read_bytes()
    assert "corrupt" in one_error_line(kforge("show", "1", "--db", str(db)))
    assert "corrupt" in one_error_line(kforge("sessions", "--db", str(db)))
    assert db.read_bytes() == before


def test_database_path_that_is_a_folder(tmp_path: Path):
    assert "is a folder" in one_error_line(kforge("sessions", "--db", str(tmp_path)))


def test_detached_search_survives_and_stops_on_command(tmp_path: Path):
    db = tmp_path / "k.db"
    sid = make_db(db, {"fake": {"delay_s": 0.05}})
    started = kforge("search", "--session", str(sid), "--db", str(db), "--iterations", "500",
                     "--detach", *DOUBLES)
    assert started.returncode == 0, started.stderr
    assert "searching in the background" in started.stdout

    async def status() -> tuple[str, int, int | None]:
        store = await Store.open(db, create=False)
        try:
            s = await store.get_session(sid)
            return s.status, len(await store.list_nodes(sid)), s.engine_pid
        finally:
            await store.close()

    deadline = time.monotonic() + 60
    while asyncio.run(status())[1] < 3:
        assert time.monotonic() < deadline, (db.parent / "logs").glob("*")
        time.sleep(0.1)
    stop = kforge("stop", str(sid), "--db", str(db))
    assert stop.returncode == 0 and "asked the engine" in stop.stderr
    while asyncio.run(status())[0] != SessionStatus.STOPPED:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert asyncio.run(status())[2] is None
    log = (db.parent / "logs" / f"session-{sid}.log")
    assert log.exists()


def test_delete_session(tmp_path: Path, capsys):
    db = tmp_path / "k.db"
    sid = make_db(db)
    assert main(["delete", str(sid), "--yes", "--db", str(db)]) == 0
    assert main(["sessions", "--db", str(db)]) == 0
    assert "no sessions yet" in capsys.readouterr().out


def test_doctor_reports_each_piece(tmp_path: Path, capsys):
    assert main(["doctor", "--db", str(tmp_path / "k.db")]) == 0
    report = capsys.readouterr().out
    for piece in ("Python", "torch", "GPU", "NVRTC", "database", "config", "TUI"):
        assert piece in report


def test_search_a_model_file_profiles_then_searches(tmp_path: Path):
    db = tmp_path / "k.db"
    toy = REPO / "tests" / "capture" / "capture_toy.py"
    result = kforge("search", f"{toy}:build", "--device", "cpu", "--db", str(db),
                    "--iterations", "2", "--top", "2", "--quiet", *DOUBLES)
    assert result.returncode == 0, result.stderr
    assert "stored as session 1" in result.stdout

    async def nodes() -> int:
        store = await Store.open(db, create=False)
        try:
            return len(await store.list_nodes(1))
        finally:
            await store.close()

    assert asyncio.run(nodes()) == 4


def test_search_a_model_without_a_gpu_stops_before_profiling(tmp_path: Path):
    result = kforge("search", "gemma4", "--db", str(tmp_path / "k.db"))
    assert "no CUDA GPU" in one_error_line(result)
    assert not (tmp_path / "k.db").exists()
