"""Stored and typed text is shown literally: markup in a model path neither crashes the TUI
(``[/final]``) nor makes an action (``[@click=...]``), terminal escapes are dropped, and toasts
show settings such as ``[search]`` as they are written."""

from __future__ import annotations

from pathlib import Path

from kforge.core.candidate import Candidate, EvalOutcome, EvalStatus
from kforge.store import Store
from kforge_tui.header import short_model
from kforge_tui.screens.session import SessionScreen
from kforge_tui.screens.sessions import SessionsScreen
from kforge_tui.widgets.code_view import CodeView
from kforge_tui.widgets.search_tree import SearchTree
from kforge_tui.widgets.tables import VimTable
from tests.doubles import sample_cards
from tests.tui.conftest import make_app, until

CLOSING = "/models/run[/final]/net[/].py:build"
CLICK = "[@click=app.quit]net.py:build"
ESCAPE = "\x1b]52;c;cm0gLXJmIH4K\x07"
SIZE = (120, 30)


def screen_text(app) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


async def make_db(db: Path) -> None:
    async with await Store.open(db) as store:
        gpu = {"name": f"GPU [b]{ESCAPE}", "arch": "sm_90"}
        sid = await store.create_profiled_session(CLOSING, {}, gpu, sample_cards())
        await store.create_profiled_session(CLICK, {}, gpu, sample_cards())
        card = (await store.list_cards(sid))[0]
        node = await store.add_node(sid, card.id, None, "new")
        await store.set_candidate(node, Candidate(f"// [red]{ESCAPE}[/]\n", plan={},
                                                  meta={"approach": "[/final]"}))
        await store.finish_node(node, EvalOutcome(EvalStatus.COMPILE_ERROR,
                                                  summary=f"[/] {ESCAPE}",
                                                  compile_log=f"[@click=app.quit]{ESCAPE}"), None)
        await store.log(sid, f"[/final] {ESCAPE}", "warning")


async def test_markup_and_escapes_in_stored_text_show_literally(tmp_path: Path):
    db = tmp_path / "k.db"
    await make_db(db)
    app = make_app(db)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen)
                    and app.screen.query_one(VimTable).row_count == 2, what="the sessions list")
        table = app.screen.query_one(VimTable)
        cells = [table.get_row(key) for key in ("1", "2")]
        models = [str(row[1]) for row in cells]
        assert models[0] == short_model(CLOSING) and models[0].endswith("].py:build")
        assert models[1].startswith("[@click=app.quit]")
        # no cell carries a style or an action of its own making
        assert not [span for row in cells for cell in row for span in getattr(cell, "spans", [])]
        assert "\x1b" not in screen_text(app)
        table.select_key("1")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                    and app.screen.query_one(SearchTree).card is not None, what="the session")
        await pilot.press("2", "j")  # the tree, its one node
        kernel = app.screen.query_one("#kernel", CodeView)
        await until(pilot, lambda: "[red]" in kernel.text, what="the kernel")
        assert "\x1b" not in kernel.text and "\x07" not in kernel.text
        assert app.is_running


async def test_toasts_show_their_text_as_written(tmp_path: Path):
    db = tmp_path / "k.db"
    await make_db(db)
    app = make_app(db)
    async with app.run_test(size=SIZE) as pilot:
        message = f"set [search] proposer and [keys] prune [/final] [@click=app.quit]x {ESCAPE}"
        app.notify(message, title="[b]kforge[/b]")
        app.screen.notify("[llm] base_url is missing")  # a widget's toast takes the same path
        await pilot.pause()
        shown = [n.message for n in app._notifications]
        assert shown[0].startswith("set [search] proposer and [keys] prune [/final] [@click")
        assert "\x1b" not in shown[0] and shown[1] == "[llm] base_url is missing"
        assert [n.title for n in app._notifications][0] == "[b]kforge[/b]"
        assert not [n for n in app._notifications if n.markup]
        assert app.is_running


async def test_the_palette_shows_stored_text_literally(tmp_path: Path):
    """The sessions' palette entries quote their model paths: listed and matched, markup in them
    is text (the palette's fuzzy highlight reads none either)."""
    db = tmp_path / "k.db"
    await make_db(db)
    app = make_app(db)
    async with app.run_test(size=SIZE) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen)
                    and app.screen.query_one(VimTable).row_count == 2, what="the sessions list")
        await pilot.press("ctrl+p")
        await until(pilot, lambda: "Open session 2" in screen_text(app), what="the palette")
        assert "[@click=app.quit]net.py:build" in screen_text(app)
        await pilot.press(*"open session")
        await until(pilot, lambda: "[/final]" in screen_text(app), what="the palette's matches")
        assert "\x1b" not in screen_text(app)
        assert app.is_running


async def make_session_db(db: Path) -> None:
    """A session whose op name and kernel carry markup and escapes (a node's action is one of
    kforge's own words: any other is a damaged row, refused as it is read)."""
    from dataclasses import replace

    async with await Store.open(db) as store:
        cards = sample_cards()
        cards[0] = replace(cards[0], op=f"aten.soft[/final]{ESCAPE}.default", key="")
        sid = await store.create_profiled_session(f"m{ESCAPE}[/final].py:f", {},
                                                  {"name": "g", "arch": "sm_90"}, cards)
        card = (await store.list_cards(sid))[0]
        node = await store.add_node(sid, card.id, None, "new")
        await store.set_candidate(node, Candidate(f"// [/final]{ESCAPE}\n", plan={}, meta={}))
        await store.finish_node(node, EvalOutcome(EvalStatus.COMPILE_ERROR, summary="s"), None)


async def test_the_session_screen_shows_stored_and_typed_text_literally(tmp_path: Path):
    """The tree's op line, a typed filter in a pane's title, the diff of a kernel and
    a question quoting the model: markup shows as written, escapes never reach the screen."""
    db = tmp_path / "k.db"
    await make_session_db(db)
    app = make_app(db)
    async with app.run_test(size=(140, 40)) as pilot:
        await until(pilot, lambda: isinstance(app.screen, SessionsScreen)
                    and app.screen.query_one(VimTable).row_count == 1, what="the sessions list")
        await pilot.press("d")  # the delete question quotes the model
        await until(pilot, lambda: "Delete session 1" in screen_text(app), what="the question")
        assert "\x1b" not in screen_text(app) and "[/final].py:f" in screen_text(app)
        await pilot.press("n")
        await pilot.press("enter")
        await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                    and app.screen.query_one(SearchTree).card is not None, what="the session")
        await pilot.press("2", "j")
        await until(pilot, lambda: "#1 new compile error" in screen_text(app), what="the node")
        assert "soft[/final]" in screen_text(app)
        assert not [c for c in ("\x1b", "\x07", "\x9b") if c in screen_text(app)]
        await until(pilot, lambda: app.screen.detail is not None, what="the node's kernel")
        await pilot.press("d")  # (before its kernel has loaded, "d" says to try again)
        await until(pilot, lambda: "against its parent" in screen_text(app), what="the diff")
        assert "// [/final]" in screen_text(app) and "\x1b" not in screen_text(app)
        await pilot.press("escape", "1", "slash")
        await pilot.pause(0.2)
        await pilot.press(*"[/final]", "enter")
        await until(pilot, lambda: 'filter "[/final]"' in screen_text(app), what="the filter")
        assert app.is_running
