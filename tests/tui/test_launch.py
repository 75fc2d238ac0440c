"""Starting searches from the TUI through the real ``python -m kforge ... --json``: the session the
CLI's answer names is the one the TUI opens, and its progress reaches the form's log."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from textual.widgets import Input

from kforge.store import SessionStatus, Store
from kforge_tui.launch import kforge_command, resume_argv, run_kforge
from kforge_tui.screens import new_session
from kforge_tui.screens.dialogs import TrustPlugins
from kforge_tui.screens.new_session import NewSessionScreen
from kforge_tui.screens.session import SessionScreen
from kforge_tui.widgets.wrapping_log import WrappingLog
from tests.doubles import sample_cards
from tests.tui.conftest import make_app, until

DOUBLES = ["--proposer", "tests.doubles:make_proposer",
           "--evaluator", "tests.doubles:make_evaluator"]
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _repo_on_the_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kforge subprocess imports the test doubles from this checkout."""
    monkeypatch.setenv("PYTHONPATH", str(REPO))


async def ready_session(db: Path, settings: dict | None = None) -> int:
    async with await Store.open(db) as store:
        return await store.create_profiled_session("toy", settings or {"fake": {}},
                                                   {"name": "Fake GPU", "arch": "sm_90"},
                                                   sample_cards())


async def until_released(db: Path, sid: int, timeout_s: float = 60.0) -> str:
    """Wait for the detached engine to finish the session and let it go."""
    for _ in range(int(timeout_s / 0.1)):
        async with await Store.open(db, create=False) as store:
            session = await store.get_session(sid)
        if session.engine_pid is None and session.status != SessionStatus.READY:
            return session.status
        await asyncio.sleep(0.1)
    raise AssertionError(f"the detached engine of session {sid} never finished")


async def test_a_detached_resume_answers_with_its_session_and_engine(tmp_path: Path):
    db = tmp_path / "k.db"
    sid = await ready_session(db)
    progress: list[str] = []
    answer = await run_kforge([*resume_argv(sid, db), "--iterations", "1", *DOUBLES],
                              progress.append)
    assert answer["session"] == sid and answer["detached"] and answer["engine_pid"] > 0
    assert any("searching in the background" in line for line in progress)
    assert await until_released(db, sid) == SessionStatus.DONE


async def test_the_new_session_form_opens_the_session_the_cli_names(tmp_path: Path,
                                                                    monkeypatch):
    db = tmp_path / "k.db"
    sid = await ready_session(db)
    # Profiling needs a model and a GPU; the rest of the path is the real one.
    command = [*kforge_command(), "search", "--session", str(sid), "--db", str(db), "--detach",
               "--json", "--iterations", "1", *DOUBLES]
    monkeypatch.setattr(new_session, "search_argv", lambda form, _db: command)
    app = make_app(db)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.press("n")
        await until(pilot, lambda: isinstance(app.screen, NewSessionScreen), what="the form")
        app.screen.query_one("#model", Input).value = "toy"
        progress = app.screen.query_one(WrappingLog)  # read after the form has closed
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                    and app.screen.state is not None, timeout_s=60,
                    what="the new session to open")
        assert app.screen.session_id == sid
        assert any("searching in the background" in line for line in progress.messages)
    assert await until_released(db, sid) == SessionStatus.DONE


async def test_a_session_naming_plug_ins_resumes_from_the_tui_once_trusted(tmp_path: Path):
    db = tmp_path / "k.db"
    sid = await ready_session(db, {"search": {"proposer": "tests.doubles:make_proposer",
                                              "evaluator": "tests.doubles:make_evaluator",
                                              "iterations_per_op": 1}})
    app = make_app(db, session=sid)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                    and app.screen.state is not None, what="the session")
        await pilot.press("r")
        await until(pilot, lambda: isinstance(app.screen, TrustPlugins), what="the question")
        await pilot.press("t")
        # the real `kforge resume --trust-plugins`: the CLI takes the TUI's yes
        await until(pilot, lambda: any(f"started an engine for session {sid} (process "
                                       in n.message for n in app._notifications), timeout_s=60,
                    what="the engine to start")
        # the search's end is said, with why, in one notice
        await until(pilot, lambda: any(f"the search of session {sid} ended, done: iteration "
                                       "budget spent" in n.message
                                       for n in app._notifications), timeout_s=60,
                    what="the search's end")
        await until(pilot, lambda: app.starting == {}, what="the engine seen started")
    assert await until_released(db, sid) == SessionStatus.DONE
