"""Pilot tests: browsing sessions and a session's panes with the keyboard only."""

from __future__ import annotations

from kforge.store import Store
from kforge_tui.screens.dialogs import Choose, DiffView
from kforge_tui.screens.help import Help
from kforge_tui.screens.session import SessionScreen
from kforge_tui.screens.sessions import SessionsScreen
from kforge_tui.widgets.code_view import CodeView
from kforge_tui.widgets.search_tree import SearchTree
from kforge_tui.widgets.tables import OpTable, VimTable
from tests.tui.conftest import NO_GPU, make_app, until


def session_screen(app) -> SessionScreen:
    assert isinstance(app.screen, SessionScreen), type(app.screen)
    return app.screen


async def open_first_session(pilot) -> SessionScreen:
    app = pilot.app
    await until(pilot, lambda: isinstance(app.screen, SessionsScreen)
                and app.screen.query_one(VimTable).row_count == 2, what="the sessions list")
    await pilot.press("enter")
    await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                and app.screen.query_one(SearchTree).card is not None, what="the session")
    return session_screen(app)


async def test_sessions_list_shows_each_session_with_its_figures(fixture_db):
    db, _ = fixture_db
    app = make_app(db)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen)
                    and app.screen.query_one(VimTable).row_count == 2)
        table = app.screen.query_one(VimTable)
        first = [str(cell) for cell in table.get_row("1")]
        assert first[:4] == ["1", "toy", "Fake GPU", "stopped"]
        assert first[6] == "1.60x" and first[7] == "$0.08" and first[8] == "59m ago"
        assert [str(c) for c in table.get_row("2")][1] == "resnet50-tiny"


async def test_keyboard_reaches_every_pane_and_shows_the_selected_kernel(fixture_db):
    db, ids = fixture_db
    app = make_app(db)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_first_session(pilot)
        ops = screen.query_one(OpTable)
        assert ops.row_count == 4 and ops.selected_key == str(ids["card"])
        tree = screen.query_one(SearchTree)
        await pilot.press("2")
        assert screen.active == "tree"
        await until(pilot, lambda: tree.has_focus, what="the tree to take focus")
        # The cursor starts on the best node; g goes to the top, j steps down.
        assert tree.selected_id == ids["a1"]
        await pilot.press("g", "j")
        assert tree.selected_id == ids["a"]
        await pilot.press("l")  # a is open already: l steps into its first child
        assert tree.selected_id == ids["a1"]
        await pilot.press("h")  # back to the parent
        assert tree.selected_id == ids["a"]
        await pilot.press("G")
        assert tree.selected_id == ids["c"]
        await pilot.press("k", "l")  # b is closed: l opens it and shows its repair
        await pilot.press("j")
        assert tree.selected_id == ids["b1"]
        await until(pilot, lambda: screen.detail is not None
                    and screen.detail.row.id == ids["b1"], what="the node's detail")
        await pilot.press("3")
        kernel = screen.query_one("#kernel", CodeView)
        await until(pilot, lambda: kernel.has_focus)
        assert f"softmax_rows_{ids['b1']}" in kernel.text and kernel.language == "cuda"
        await pilot.press("4")
        assert "status: ok" in screen.query_one("#eval", CodeView).text
        await pilot.press("right_square_bracket")
        assert "Write a faster softmax." in screen.query_one("#llm", CodeView).text
        await pilot.press("tab")  # wraps round to the ops pane
        assert screen.active == "ops"
        await pilot.press("escape")
        assert isinstance(app.screen, SessionsScreen)


async def test_small_terminal_shows_one_pane_and_a_wide_one_all_four(fixture_db):
    db, _ = fixture_db
    app = make_app(db)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_first_session(pilot)
        shown = [p.pane for p in screen.query("Pane") if p.display and p.region.height]
        assert shown == ["ops"]
        await pilot.resize_terminal(160, 48)
        await pilot.pause()
        shown = sorted(p.pane for p in screen.query("Pane") if p.region.height)
        assert shown == ["code", "logs", "ops", "tree"]


async def test_best_jumps_and_diff_shows_the_change_from_the_parent(fixture_db):
    db, ids = fixture_db
    app = make_app(db)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await open_first_session(pilot)
        await pilot.press("2", "g", "b")
        tree = screen.query_one(SearchTree)
        assert tree.selected_id == ids["a1"]
        await until(pilot, lambda: screen.detail is not None
                    and screen.detail.row.id == ids["a1"])
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, DiffView))
        lines = app.screen.lines
        assert f"--- #{ids['a']}/kernel.cu" in lines and f"+++ #{ids['a1']}/kernel.cu" in lines
        assert any(line.startswith("+") and f"softmax_rows_{ids['a1']}" in line for line in lines)
        await pilot.press("escape")
        assert app.screen is screen


async def test_filters_narrow_ops_by_name_and_nodes_by_status(fixture_db):
    db, ids = fixture_db
    app = make_app(db)
    async with app.run_test(size=(80, 24)) as pilot:
        screen = await open_first_session(pilot)
        await pilot.press("slash")
        await pilot.press(*"rel", "enter")
        assert [c.card.short_op for c in screen.query_one(OpTable).visible_cards()] == ["relu"]
        await pilot.press("slash", "ctrl+u", "enter")  # an empty filter shows all again
        assert screen.query_one(OpTable).row_count == 4
        await pilot.press("g")  # back to _softmax, the op with a tree
        await pilot.press("2", "slash")
        await until(pilot, lambda: isinstance(app.screen, Choose))
        await pilot.press("j", "j", "enter")  # all, ok, failed
        tree = screen.query_one(SearchTree)
        shown = [line.data.id for line in tree.root.children]
        assert shown == [ids["b"]]  # the only top-level node with a failure below or at it
        assert not tree.root.children[0].allow_expand  # its repair worked: hidden


async def test_help_lists_the_keys_with_their_ids(fixture_db):
    db, _ = fixture_db
    app = make_app(db)
    async with app.run_test(size=(100, 30)) as pilot:
        await open_first_session(pilot)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, Help))
        ids = {row[2] for row in app.screen.rows}
        assert {"prune", "pause", "best", "diff", "filter", "help", "quit"} <= ids
        await pilot.press("escape")
        assert isinstance(app.screen, SessionScreen)


async def test_without_a_database_or_gpu_it_opens_and_says_what_is_missing(tmp_path):
    app = make_app(tmp_path / "none.db", gpu=NO_GPU)
    async with app.run_test(size=(100, 30)) as pilot:
        await pilot.pause(0.1)
        notice = str(app.screen.query_one("#notice").render())
        assert "No database at" in notice and "No NVIDIA GPU here" in notice
        await pilot.press("n")
        await pilot.press(*"resnet50", "enter")
        assert any("needs an NVIDIA GPU" in n.message for n in app._notifications)
    assert not (tmp_path / "none.db").exists()


async def test_delete_asks_first_then_removes_the_session(fixture_db):
    db, _ = fixture_db
    app = make_app(db)
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.screen.query_one(VimTable).row_count == 2)
        await pilot.press("j", "d", "n")
        await pilot.pause(0.1)
        assert app.screen.query_one(VimTable).row_count == 2
        await pilot.press("d", "y")
        await until(pilot, lambda: app.screen.query_one(VimTable).row_count == 1)
    async with await Store.open(db, create=False) as store:
        assert [s.session.id for s in await store.list_sessions()] == [1]
