"""Snapshot tests (pytest-textual-snapshot) of the sessions screen, the session screen and every
shipped theme, at 80x24 and at 160x48, from the deterministic fixture database.

Update them after an intended change with ``pytest tests/tui/test_snapshots.py --snapshot-update``
and look at the report before committing."""

from __future__ import annotations

from pathlib import Path

import pytest

from kforge_tui.screens.session import SessionScreen
from kforge_tui.screens.sessions import SessionsScreen
from kforge_tui.widgets.tables import VimTable
from tests.tui.conftest import make_app, until
from tests.tui.fixtures import build_sync

SMALL, LARGE = (80, 24), (160, 48)


@pytest.fixture
def db(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fixture database, named relative to the working folder so the path on screen is
    the same in every run."""
    monkeypatch.chdir(tmp_path)
    build_sync(tmp_path / "k.db")
    return Path("k.db")


async def sessions_loaded(pilot) -> None:
    app = pilot.app
    await until(pilot, lambda: isinstance(app.screen, SessionsScreen)
                and app.screen.query_one(VimTable).row_count == 2)


async def node_shown(pilot) -> None:
    app = pilot.app
    await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                and app.screen.state is not None)
    await pilot.press("2")
    await until(pilot, lambda: app.screen.detail is not None)
    await pilot.pause(0.3)  # the tree's repaint timer


@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "160x48"])
def test_sessions_screen(snap_compare, db: Path, size):
    assert snap_compare(make_app(db), terminal_size=size, run_before=sessions_loaded)


@pytest.mark.parametrize("theme", ["kforge-dark", "kforge-light", "kforge-ansi"])
@pytest.mark.parametrize("size", [SMALL, LARGE], ids=["80x24", "160x48"])
def test_session_screen_in_each_theme(snap_compare, db: Path, theme: str, size):
    app = make_app(db, session=1, theme=theme)
    assert snap_compare(app, terminal_size=size, run_before=node_shown)
