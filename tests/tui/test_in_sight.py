"""Every key acts on what is on screen: a key that acts on a search node acts at once where the
focused pane shows that node (its tree line, or its kernel under its number), and anywhere else
names the node and asks first; the footer offers only the keys of the focused pane, in the words
of what they do now. At 80x24 (one pane at a time) and 120x40 (four panes)."""

from __future__ import annotations

from contextlib import asynccontextmanager

import pytest
from textual.widgets._footer import FooterKey

from kforge.store import SessionStatus, Store
from kforge_tui.screens.dialogs import Confirm, DiffView
from kforge_tui.screens.session import SessionScreen
from kforge_tui.widgets.search_tree import SearchTree
from tests.tui.conftest import make_app, until
from tests.tui.test_control import pruned
from tests.tui.test_navigation import open_first_session

SIZES = [(80, 24), (120, 40)]


def footer_keys(app) -> dict[str, str]:
    return {key.key_display: key.description for key in app.screen.query(FooterKey)}


@asynccontextmanager
async def first_session(fixture_db, size: tuple[int, int], pane: str = "1"):
    """The app on the fixture's first session at ``size``, with ``pane`` focused and the tree's
    node loaded: its pilot, the session screen and the fixture's ids."""
    db, ids = fixture_db
    app = make_app(db)
    async with app.run_test(size=size) as pilot:
        screen = await open_first_session(pilot)
        await pilot.press(pane)
        await until(pilot, lambda: screen.detail is not None, what="the tree's node loaded")
        yield pilot, screen, ids


@pytest.mark.parametrize("size", SIZES)
async def test_prune_on_the_op_list_names_the_hidden_node_and_asks_first(fixture_db, size):
    async with first_session(fixture_db, size) as (pilot, screen, ids):
        app, db = pilot.app, fixture_db[0]
        assert screen.query_one(SearchTree).selected_id == ids["a1"]  # the op's best
        await pilot.press("x")
        await until(pilot, lambda: isinstance(app.screen, Confirm), what="the question")
        assert app.screen.question == f"Prune node #{ids['a1']}, 1.60x ★best of _softmax 8x1024?"
        await pilot.press("enter")  # the safe answer: no
        await until(pilot, lambda: app.screen is screen, what="the question to close")
        await pilot.pause(0.2)
        assert not await pruned(db, ids["a1"])
        await pilot.press("x")
        await until(pilot, lambda: isinstance(app.screen, Confirm), what="the question again")
        await pilot.press("y")
        await until(pilot, lambda: screen.model.nodes[ids["a1"]].row.pruned, what="the prune")


@pytest.mark.parametrize("size", SIZES)
async def test_keys_act_at_once_where_the_node_shows(fixture_db, size):
    async with first_session(fixture_db, size, pane="2") as (pilot, screen, ids):
        app = pilot.app
        await pilot.press("g", "j")
        assert screen.query_one(SearchTree).selected_id == ids["a"]
        await pilot.press("x")
        await until(pilot, lambda: screen.model.nodes[ids["a"]].row.pruned, what="the prune")
        assert not isinstance(app.screen, Confirm)
        await pilot.press("3")  # its kernel, under its number
        await until(pilot, lambda: screen.detail is not None
                    and screen.detail.row.id == ids["a"], what="its kernel")
        await pilot.press("u")
        await until(pilot, lambda: not screen.model.nodes[ids["a"]].row.pruned,
                    what="the unprune")
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, DiffView), what="the diff")


@pytest.mark.parametrize("size", SIZES)
async def test_diff_and_focus_away_from_what_they_act_on_ask_first(fixture_db, size):
    async with first_session(fixture_db, size) as (pilot, screen, ids):
        app, db = pilot.app, fixture_db[0]
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, Confirm), what="the question")
        assert app.screen.question.startswith(f"Diff node #{ids['a1']}, 1.60x ★best of _softmax")
        await pilot.press("enter")  # a diff only shows: yes is the default
        await until(pilot, lambda: isinstance(app.screen, DiffView), what="the diff")
        await pilot.press("escape")
        await pilot.press("4")  # the logs: the op is not in sight
        await pilot.press("f")
        await until(pilot, lambda: isinstance(app.screen, Confirm), what="the question")
        assert app.screen.question == "Focus the search on _softmax 8x1024?"
        await pilot.press("n")
        await pilot.pause(0.2)
        async with await Store.open(db, create=False) as store:
            assert (await store.get_session(1)).settings["search"].get("focus") is None


@pytest.mark.parametrize("size", SIZES)
async def test_the_footer_offers_the_focused_panes_keys(fixture_db, size):
    async with first_session(fixture_db, size) as (pilot, screen, _):
        app = pilot.app
        await until(pilot, lambda: "s" in footer_keys(app), what="the op list's footer")
        keys = footer_keys(app)
        assert "x" not in keys and "d" not in keys  # they act on the tree's node
        assert keys.get("f") == "focus" and keys.get("i") == "details"
        assert keys.get("/") == "filter" or size[0] < 100  # 80 columns: no room left for it
        await pilot.press("2")
        await until(pilot, lambda: "x" in footer_keys(app), what="the tree's footer")
        keys = footer_keys(app)
        assert keys["x"] == "prune" and "f" in keys and "s" not in keys
        await pilot.press("4")
        await until(pilot, lambda: "x" not in footer_keys(app), what="the logs' footer")
        keys = footer_keys(app)
        assert keys.get("/") == "find"  # in the node's evaluation report
        assert "f" not in keys and "d" not in keys
        assert screen.active == "logs"


async def test_the_footer_says_resume_while_the_search_is_paused(fixture_db):
    db, _ = fixture_db
    async with await Store.open(db, create=False) as store:
        await store.claim_engine(1)  # this process: a live engine
        await store.set_session_status(1, SessionStatus.RUNNING)
    app = make_app(db, session=1)
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                    and app.screen.state is not None and app.screen.state.alive, what="live")
        await until(pilot, lambda: footer_keys(app).get("p") == "pause", what="p pause")
        async with await Store.open(db, create=False) as store:
            await store.set_session_status(1, SessionStatus.PAUSED)
        await until(pilot, lambda: footer_keys(app).get("p") == "resume", what="p resume")
