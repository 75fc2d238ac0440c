"""What the TUI says of itself: kforge's notices literal and Textual's with their markup, a theme
a colour depth does not offer said so, the demo writing nothing of the user's, a read-only
database marked as such (its write keys saying why they are off), an engine starting shown as
starting, a search's end said with why, and a speedup near 1 never shown as 1.00x."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from textual.widgets._toast import Toast

from kforge.core.fmt import fmt_speedup
from kforge.store import SessionStatus, Store
from kforge.store import connection as store_module
from kforge_tui import app as app_module
from kforge_tui.screens.session import SessionScreen
from kforge_tui.screens.sessions import SessionsScreen
from kforge_tui.widgets.tables import VimTable
from tests.tui.conftest import make_app, until
from tests.tui.test_control import pruned
from tests.tui.test_defects import notices, screen_lines
from tests.tui.test_navigation import open_first_session
from tests.tui.test_render_budget import session_open


def toasts(app) -> str:
    """The text of the toasts on screen, as drawn."""
    return "\n".join(toast.render().plain for toast in app.screen.query(Toast))


async def test_textuals_own_notices_keep_their_markup_and_kforges_stay_literal(fixture_db):
    db, _ = fixture_db
    app = make_app(db)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await pilot.pause(0.2)
        await pilot.press("ctrl+c")  # Textual's: how to quit
        await until(pilot, lambda: notices(app, "to quit the app"), what="the notice")
        (quit_notice,) = [n for n in app._notifications if "to quit" in n.message]
        assert quit_notice.markup and quit_notice.message == "Press [b]ctrl+q[/b] to quit the app"
        await until(pilot, lambda: "Press ctrl+q to quit the app" in toasts(app),
                    what="the toast, its markup read")
        app.notify("set [search] proposer [b]now[/b]")  # kforge's
        await until(pilot, lambda: "set [search] proposer [b]now[/b]" in toasts(app),
                    what="the toast, literal")


@pytest.mark.parametrize("terminal", ["256"], indirect=True)
async def test_a_theme_this_depth_does_not_offer_says_so(fixture_db, terminal):
    db, _ = fixture_db
    app = make_app(db, theme="tokyo-night")
    assert app._problems == ["theme 'tokyo-night' is not made for this terminal's 256 colours; "
                             "using kforge-dark"]
    app = make_app(db, theme="no-such-theme")
    assert app._problems == ["theme 'no-such-theme' does not exist; using kforge-dark"]


async def test_picking_a_theme_in_the_demo_writes_nothing(tmp_path: Path, monkeypatch):
    config = tmp_path / "config.toml"
    monkeypatch.setenv("KFORGE_CONFIG", str(config))
    from kforge_tui.demo import replay

    db = tmp_path / "demo.db"
    session = await replay(db)
    app = make_app(db, session=session, demo=True, remember_theme=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.3)
        app.theme = "kforge-light"
        await pilot.pause(0.2)
    assert not config.exists()
    app = make_app(db, remember_theme=True)  # the user's own sessions: remembered
    async with app.run_test(size=(80, 24)) as pilot:
        app.theme = "kforge-light"
        await pilot.pause(0.2)
    assert 'theme = "kforge-light"' in config.read_text()


@pytest.fixture
def read_only_here(monkeypatch):
    """This process may not write the database (as a user other than its owner): the store
    opens it read-only. (The tests run as whoever; the check is the store's.)"""
    real = store_module.os.access
    monkeypatch.setattr(store_module.os, "access",
                        lambda path, mode: real(path, mode) and not mode & store_module.os.W_OK)


async def test_a_read_only_database_is_marked_and_its_write_keys_say_why(fixture_db,
                                                                        read_only_here,
                                                                        monkeypatch):
    db, ids = fixture_db
    app = make_app(db)
    async with app.run_test(size=(80, 24)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen)
                    and app.screen.query_one(VimTable).row_count == 2, what="the list")
        await until(pilot, lambda: "read-only" in screen_lines(app)[0], what="the mark")
        await pilot.press("d")
        await until(pilot, lambda: notices(app, "read-only here"), what="why not")
        assert notices(app, "deleting a session needs to write it")
        screen = await open_first_session(pilot)
        assert "read-only" in screen_lines(app)[0]
        await pilot.press("2", "g", "j", "x")
        await until(pilot, lambda: notices(app, "prune needs to write it"), what="why not")
        assert not notices(app, "attempt to write")
        assert screen is app.screen
    monkeypatch.undo()  # writable again, to look
    assert not await pruned(db, ids["a"])


async def test_an_engine_started_shows_as_starting_until_it_takes_the_session(fixture_db,
                                                                             monkeypatch):
    db, _ = fixture_db
    engine = await asyncio.create_subprocess_exec("sleep", "60")

    async def detached(argv, on_line):  # kforge resume --detach --json, its engine slow to start
        return {"session": 1, "engine_pid": engine.pid, "log": "/tmp/engine.log"}

    monkeypatch.setattr(app_module, "run_kforge", detached)
    app = make_app(db, session=1)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                        and app.screen.state is not None, what="the session")
            assert "stopped — r to resume" in screen_lines(app)[0]
            await pilot.press("r")
            await until(pilot, lambda: f"starting (engine process {engine.pid})…"
                        in screen_lines(app)[0], what="starting")
            async with await Store.open(db, create=False) as store:
                await store.claim_engine(1, pid=engine.pid)
                await store.set_session_status(1, SessionStatus.RUNNING)
            await until(pilot, lambda: "running (engine live)" in screen_lines(app)[0],
                        what="the engine live")
            await until(pilot, lambda: app.starting == {}, what="the engine seen started")
    finally:
        engine.kill()
        await engine.wait()


async def test_an_engine_that_ends_before_it_starts_is_said(fixture_db, monkeypatch):
    db, _ = fixture_db
    engine = await asyncio.create_subprocess_exec("true")
    await engine.wait()

    async def detached(argv, on_line):
        return {"session": 1, "engine_pid": engine.pid, "log": "/tmp/engine.log"}

    monkeypatch.setattr(app_module, "run_kforge", detached)
    app = make_app(db, session=1)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                    and app.screen.state is not None, what="the session")
        await pilot.press("r")
        await until(pilot, lambda: notices(app, f"(process {engine.pid}) ended before it took "
                                                "the session: its log says why"), what="why")
        assert "stopped — r to resume" in screen_lines(app)[0]


async def test_a_search_that_ends_says_why_in_one_notice(fixture_db):
    db, _ = fixture_db
    app = make_app(db, session=1)
    async with app.run_test(size=(80, 24)) as pilot:
        await session_open(pilot)
        async with await Store.open(db, create=False) as store:  # as an engine ends
            await store.claim_engine(1)
            await store.set_session_status(1, SessionStatus.RUNNING)
            await store.log(1, "search done: no op left to search (3 done)")
            await store.release_engine(1, SessionStatus.DONE)
        await until(pilot, lambda: notices(app, "the search of session 1 ended, done: search "
                                                "done: no op left to search (3 done)"),
                    what="the end, with why")


def test_a_speedup_near_1_never_reads_1x():
    assert [fmt_speedup(x) for x in (0.997, 0.9999, 1.0, 1.004, 1.6, 0.29)] == [
        "0.997x", "0.999x", "1.00x", "1.004x", "1.60x", "0.29x"]


async def test_the_demo_refuses_a_write_before_asking_about_it(tmp_path: Path):
    from kforge_tui.demo import replay

    db = tmp_path / "demo.db"
    session = await replay(db)
    app = make_app(db, session=session, demo=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await session_open(pilot)
        for key in ("x", "f"):  # on the op list: each would ask first
            await pilot.press(key)
            await pilot.pause(0.1)
            assert isinstance(app.screen, SessionScreen)
        assert len(notices(app, "the demo is a read-only recording")) == 2
