"""Every verdict shows its reason in the TUI, at 80x24 too: an op's details (one key from its row)
say why it has its status, its full shapes, dtypes and strides, and each figure's basis; help
lists kforge's keys as the panes take them, and a legend of every symbol and label."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console
from textual.widgets import DataTable

from kforge_tui.diffing import wrapped
from kforge_tui.legend import HEADER, OPS, SESSIONS, TREE
from kforge_tui.screens.dialogs import Reading
from kforge_tui.screens.help import Help
from kforge_tui.widgets.scrolling import VimScroll
from kforge_tui.widgets.tables import OpTable
from tests.tui.conftest import make_app, until
from tests.tui.test_defects import screen_lines
from tests.tui.test_op_table_fit import long_session, opened

SIZES = [(80, 24), (120, 40)]


def reading_text(app) -> str:
    """What the open dialog's box holds, rendered whole at its width (it may scroll)."""
    dialog = app.screen
    width = dialog.query_one(VimScroll).scrollable_content_region.width
    console = Console(width=width, file=io.StringIO(), color_system=None)
    console.print(dialog.render_text(width))
    return console.file.getvalue()


async def details_of_row(pilot, table: OpTable, row: int) -> str:
    app = pilot.app
    await pilot.press("1", "g", *["j"] * row, "i")
    await until(pilot, lambda: isinstance(app.screen, Reading), what="the op's details")
    await pilot.pause(0.2)
    return " ".join(reading_text(app).split())  # its wrapped lines joined


@pytest.mark.parametrize("size", SIZES)
async def test_a_skipped_ops_reason_and_whole_shapes_are_one_key_from_its_row(tmp_path: Path,
                                                                             size):
    db = tmp_path / "k.db"
    sid = await long_session(db)
    app = make_app(db, session=sid)
    async with app.run_test(size=size) as pilot:
        table = await opened(pilot)
        skipped = table.visible_cards()[2]
        assert skipped.status == "skipped"
        text = await details_of_row(pilot, table, 2)
        assert "status skipped: library: no kernel family for this op" in text
        assert "0 tensor float16 shape 64 strides 1 (contiguous)" in text  # relu's, renamed
        assert "share 16.7% of the profiled model's time (50.0 us of GPU time in 4 calls over " \
            "one model run)" in text
        assert "×eager -: this op has no kernel that beats eager yet" in text
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, Reading), what="back")
        # a done op: its stop reason, which the narrow table cuts
        text = await details_of_row(pilot, table, 1)
        assert "status done: 8 iterations spent without a faster kernel" in text


async def test_each_figure_says_its_basis(tmp_path: Path):
    from tests.tui.test_80x24 import mid_search

    db = tmp_path / "k.db"
    sid = await mid_search(db)
    app = make_app(db, session=sid)
    async with app.run_test(size=(80, 24)) as pilot:
        table = await opened(pilot, 9)
        text = await details_of_row(pilot, table, 0)  # the focused op, a kernel confirming
        assert "status confirming: a would-be best kernel is under confirmation" in text
        assert "focus the search is focused on this op" in text
        assert "eager 254.9 us per call: the evaluator's device time, the op alone (eval)" \
            in text
        assert "compile 300.0 us per call: torch.compile of the op alone" in text
        assert "×eager -: this op has no kernel that beats eager or torch.compile yet" in text
        assert "strides 8388608x262144x128x1" in text


@pytest.mark.parametrize("size", SIZES)
async def test_help_lists_kforges_keys_and_a_legend_and_scrolls_with_the_panes_keys(
        fixture_db, size):
    db, _ = fixture_db
    app = make_app(db, session=1)
    async with app.run_test(size=size) as pilot:
        await until(pilot, lambda: app.screen.query(OpTable) and app.screen.state is not None,
                    what="the session")
        await pilot.press("2", "question_mark")
        await until(pilot, lambda: isinstance(app.screen, Help), what="help")
        help_screen = app.screen
        ids = [row[2] for row in help_screen.rows]
        assert "-" not in ids and len(ids) == len(set(ids))  # kforge's keys, each once
        keys = {row[2]: row[0] for row in help_screen.rows}
        assert keys["down"] == "j ↓" and keys["top"].startswith("g")
        assert {"half_down", "half_up", "select", "expand", "collapse"} <= set(keys)
        symbols = [symbol for symbol, _ in help_screen.legend]
        assert symbols[:len(TREE)] == [s for s, _ in TREE]  # the focused pane's first
        assert set(symbols) == {s for s, _ in (*TREE, *OPS, *HEADER)}
        scroll = help_screen.query_one(VimScroll)
        assert scroll.has_focus and help_screen.query_one(DataTable).row_count == len(ids)
        await pilot.press("j")
        await until(pilot, lambda: scroll.scroll_y == 1, what="j to scroll")
        await pilot.press("G")
        await until(pilot, lambda: scroll.scroll_y == scroll.max_scroll_y > 1, what="G")
        await pilot.pause(0.1)
        assert any("a node with children" in line for line in screen_lines(app)) or \
            any("time searched" in line for line in screen_lines(app))
        await pilot.press("g")
        await until(pilot, lambda: scroll.scroll_y == 0, what="g")
        await pilot.press("escape", "escape", "escape")
        await until(pilot, lambda: not isinstance(app.screen, Help), what="help to close")


async def test_the_sessions_list_has_its_own_legend(fixture_db):
    db, _ = fixture_db
    app = make_app(db)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause(0.3)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, Help), what="help")
        assert app.screen.legend == SESSIONS


def test_every_symbol_the_screens_draw_is_in_a_legend():
    from kforge_tui import format as shown

    symbols = " ".join(symbol for symbol, _ in (*TREE, *OPS, *HEADER, *SESSIONS))
    icons = [value for name, value in vars(shown).items() if name.startswith("ICON_")]
    assert icons and all(icon in symbols for icon in icons)
    for label in ("share", "×eager", "trend", "eager prof", "eager eval", "calls", "dtype",
                  "shapes", "◎", "└", "n=", "↳", "proj", "e2e", "it", "●"):
        assert label in symbols, label


@pytest.mark.parametrize(("line", "rows"), [
    ("+  float m = -INFINITY;", ["+  float m", "+ = -INFIN", "+ITY;"]),
    ("-  return x + y;", ["-  return ", "-x + y;"]),
    ("   unchanged line", ["   unchang", " ed line"]),
    ("@@ -1,4 +1,5 @@", ["@@ -1,4 +1", " ,5 @@"]),  # a hunk's line reads on, unmarked
    ("+short", ["+short"]),
])
def test_a_wrapped_diff_line_keeps_its_mark_on_each_row(line, rows):
    assert wrapped(line, 10) == rows
