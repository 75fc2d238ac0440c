"""The op table at 80 columns: every column fits, narrower forms of its cells taken in order
(the shapes, a stop reason, a long op name, the share bar, the status words), so that each op's
name and status show without scrolling sideways; where even they do not fit, whole cells."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kforge.store import CardStatus, Store
from kforge_tui.screens.session import SessionScreen
from kforge_tui.widgets.search_tree import SearchTree
from kforge_tui.widgets.tables import OpTable, narrowed, short_status, status_text
from tests.doubles import sample_cards
from tests.tui.conftest import make_app, until
from tests.tui.fixtures import GPU, baseline
from tests.tui.test_defects import screen_lines
from tests.tui.test_pictures import card_row

LONG_OPS = ["aten._scaled_dot_product_flash_attention.default", "aten.native_layer_norm.default",
            "aten.addmm.default", "aten.gelu.default", "aten._log_softmax_backward_data.default"]
REASONS = {1: (CardStatus.DONE, "8 iterations spent without a faster kernel"),
           2: (CardStatus.SKIPPED, "library: no kernel family for this op"),
           3: (CardStatus.STOPPED, "budget")}


async def long_session(db: Path) -> int:
    """A session of 30 ops (more than the table's height), long op names among them, stop
    reasons, and the search focused on the first op."""
    base = sample_cards()
    cards = [base[i % 3].with_(op=LONG_OPS[i] if i < len(LONG_OPS) else f"aten.op_{i}.default",
                               share=0.5 / (i + 1)) for i in range(30)]
    async with await Store.open(db) as store:
        sid = await store.create_profiled_session("toy", {}, GPU, cards)
        rows = await store.list_cards(sid)
        await store.update_card(rows[0].id, status=CardStatus.SEARCHING)
        await store.update_settings(sid, {"search": {"focus": rows[0].id}})
        for index, (status, reason) in REASONS.items():
            await store.update_card(rows[index].id, status=status, stop_reason=reason)
    return sid


async def opened(pilot, rows: int = 30) -> OpTable:
    """The session screen's op table once it lists ``rows`` rows."""
    app = pilot.app
    await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                and app.screen.state is not None
                and app.screen.query_one(OpTable).row_count == rows, what="the op table")
    await pilot.pause(0.1)
    return app.screen.query_one(OpTable)


def shown_rows(app, table: OpTable) -> list[str]:
    """The op rows as the screen shows them now, top to bottom."""
    top = table.region.y + table.header_height
    return screen_lines(app)[top:table.region.y + table.region.height]


async def test_every_status_shows_whole_at_80_columns(tmp_path: Path):
    db = tmp_path / "k.db"
    sid = await long_session(db)
    app = make_app(db, session=sid)
    async with app.run_test(size=(80, 24)) as pilot:
        table = await opened(pilot)
        assert table.max_scroll_x == 0  # nothing to scroll sideways to
        header = screen_lines(app)[table.region.y]
        assert header.split("│")[1].split() == " ".join(
            table.heading(name) for name in OpTable.COLUMNS).split()
        assert table.heading("best") == "×eager" and table.heading("eager") == "eager prof"
        rows = shown_rows(app, table)
        cards = table.visible_cards()
        assert len(rows) >= 15
        for line, row in zip(rows, cards, strict=False):
            words = {row.status, short_status(row.status)}
            assert any(re.search(rf"(?<![\w…]){word}(?![\w…])", line) for word in words), line
            name = line.split("│")[1].split()[0]
            assert name == row.card.short_op or (
                name.endswith("…") and len(name) >= OpTable.OP_SHORTEST
                and row.card.short_op.startswith(name[:-1])), (name, row.card.short_op)
        assert "◎ " in rows[0]  # the focused op is marked in its status


async def test_a_wider_terminal_gets_the_whole_cells_back(tmp_path: Path):
    db = tmp_path / "k.db"
    sid = await long_session(db)
    app = make_app(db, session=sid)
    async with app.run_test(size=(80, 24)) as pilot:
        table = await opened(pilot)
        first = str(table.visible_cards()[1].id)
        assert table.get_row(first)[7].plain == "done"
        await pilot.resize_terminal(200, 24)  # the ops pane takes 80 cells and more
        await until(pilot, lambda: table.get_row(first)[7].plain.startswith("done: 8 iter"),
                    what="the stop reason back")
        await pilot.resize_terminal(80, 24)
        await until(pilot, lambda: table.get_row(first)[7].plain == "done",
                    what="the narrow status again")
        await pilot.pause(0.1)
        assert table.max_scroll_x == 0


# From 110 columns the four panes share the screen and the op list gets two fifths of it.
WIDTHS = (80, 96, 109, 110, 116, 120, 132, 160, 200, 240)
HEIGHTS = (24, 30, 40, 48)
KEPT = ("op", "share", "best", "status")


@pytest.mark.parametrize("session", ["long", "llama mid-search"])
async def test_the_op_list_fits_every_width_without_scrolling_sideways(tmp_path: Path, session):
    from tests.tui.test_80x24 import llama_cards, mid_search

    db = tmp_path / "k.db"
    sid = await (long_session if session == "long" else mid_search)(db)
    rows = 30 if session == "long" else len(llama_cards())
    app = make_app(db, session=sid)
    async with app.run_test(size=(80, 24)) as pilot:
        table = await opened(pilot, rows)
        seen: set[tuple[str, ...]] = set()
        for width in WIDTHS:
            for height in HEIGHTS:
                await pilot.resize_terminal(width, height)
                await until(pilot, lambda: table.size.width and table.virtual_size.width
                            <= table.scrollable_content_region.width,
                            what=f"the op list fitted at {width}x{height}")
                await pilot.pause(0.05)
                assert table.max_scroll_x == 0, (width, height)
                header = screen_lines(app)[table.region.y]
                for name in KEPT:
                    assert table.heading(name) in header, (width, height, name)
                dropped = [name for name in OpTable.DROPS if name not in table.shown]
                assert dropped == list(OpTable.DROPS[:len(dropped)]), (width, height)
                seen.add(table.shown)
                for line, row in zip(shown_rows(app, table), table.visible_cards(),
                                     strict=False):
                    words = {row.status, short_status(row.status), "confirming", "conf"}
                    assert any(re.search(rf"(?<![\w…]){word}(?![\w…])", line)
                               for word in words), (width, height, line)
        assert tuple(OpTable.COLUMNS) in seen  # each column shows where there is room


def test_a_status_gives_up_its_reason_then_its_word():
    row = card_row(0, 1.5)
    done = type(row)(**{**row.__dict__, "status": "done", "stop_reason": "budget spent"})
    assert status_text(done, False) == "done: budget spent"
    assert status_text(done, False, 18) == "done: budget spent"
    assert status_text(done, False, 10) == "done: bud…"
    assert status_text(done, False, 9) == "done"  # no reason at all rather than "done: …"
    assert status_text(done, False, 6) == "done"
    assert status_text(row, True, 11) == "◎ searching"
    assert status_text(row, True, 6) == "◎ run"
    # While one of its kernels is confirming, that is the op's status, reason or not.
    assert status_text(done, True, None, confirming=True) == "◎ confirming"
    assert status_text(row, True, 6, confirming=True) == "◎ conf"


@given(st.dictionaries(st.sampled_from(["op", "share", "status", "shapes"]),
                       st.integers(0, 40), min_size=4),
       st.lists(st.tuples(st.sampled_from(["op", "share", "status", "shapes"]),
                          st.integers(0, 30)), max_size=6),
       st.integers(0, 120))
def test_narrowed_columns_narrow_each_as_far_as_needed(needs, floors, room):
    widths = narrowed(needs, floors, room)
    lowest = {name: min([needs[name], *(max(floor, len(name)) for n, floor in floors
                                        if n == name)]) for name in needs}
    for name, width in widths.items():
        assert lowest[name] <= width <= needs[name]
    if sum(needs.values()) <= room:
        assert widths == needs
    elif sum(widths.values()) > room:  # cannot fit: every column as narrow as it may be
        assert widths == lowest


@pytest.mark.parametrize(("room", "widths"), [
    (60, {"op": 30, "status": 20, "shapes": 10}),
    (56, {"op": 30, "status": 20, "shapes": 6}),  # the shapes first, down to their heading
    (40, {"op": 24, "status": 10, "shapes": 6}),  # then the status, then the op name
    (10, {"op": 8, "status": 10, "shapes": 6}),  # cannot fit: each as narrow as it may be
])
def test_columns_narrow_in_the_order_given(room, widths):
    needs = {"op": 30, "status": 20, "shapes": 10}
    floors = [("shapes", 0), ("status", 10), ("op", 8)]
    assert narrowed(needs, floors, room) == widths


async def test_a_regions_op_cards_fold_under_it_whatever_the_sort(tmp_path: Path):
    db = tmp_path / "k.db"
    softmax, add, relu, view = sample_cards()
    ref = {"t": "ref", "v": "x0"}
    region = softmax.with_(op="kforge_region.r_0123456789ab.default", share=0.2, key="",
                           region={"nodes": [{"op": "aten.add.Tensor", "args": [
                               ref, {"t": "ref", "v": "x1"}], "kwargs": {}},
                               {"op": "aten._softmax.default", "args": [
                                   {"t": "ref", "v": "n0"}, -1, False], "kwargs": {}}],
                               "inputs": add.args, "outputs": ["n1"],
                               "members": [softmax.key, add.key]})
    async with await Store.open(db) as store:
        sid = await store.create_profiled_session("toy", {}, GPU, [softmax, add, relu, view,
                                                                   region])
    app = make_app(db, session=sid)
    async with app.run_test(size=(80, 24)) as pilot:
        table = await opened(pilot, rows=5)
        for _ in range(2):  # by share, then by the next sort
            ops = [row.split("│")[1].split()[0:2] for row in shown_rows(app, table)[:5]]
            first = next(i for i, op in enumerate(ops) if op[0].startswith("region("))
            assert ops[first + 1][0] == "└" and ops[first + 2][0] == "└"
            assert {ops[first + 1][1], ops[first + 2][1]} == {"_softmax", "add"}
            assert sum(op[0] == "_softmax" for op in ops) == 0  # not again on its own
            await pilot.press("s")
            await pilot.pause(0.1)


def region_of(op_cards, name: str, share: float):
    """A fusion region card over ``op_cards`` (its chain as capture stores it)."""
    first = op_cards[0]
    nodes = [{"op": card.op, "args": [{"t": "ref", "v": f"x{i}"}], "kwargs": {}}
             for i, card in enumerate(op_cards)]
    return first.with_(op=f"kforge_region.r_{name}.default", share=share, key="",
                       region={"nodes": nodes, "inputs": first.args, "outputs": ["n0"],
                               "members": [card.key for card in op_cards]})


async def test_an_op_card_two_regions_call_is_listed_under_each(tmp_path: Path):
    """A cast that starts every norm is one op card inside many regions: it is listed under
    each, and each of its rows opens that card's search tree."""
    db = tmp_path / "k.db"
    softmax, add, relu, view = sample_cards()
    first, second = region_of([add, softmax], "aaaaaaaaaaaa", 0.3), \
        region_of([add, relu], "bbbbbbbbbbbb", 0.2)
    async with await Store.open(db) as store:
        sid = await store.create_profiled_session("toy", {}, GPU, [softmax, add, relu, view,
                                                                   first, second])
        ids = {row.card.short_op: row.id for row in await store.list_cards(sid)
               if row.card.region is None}
    app = make_app(db, session=sid)
    async with app.run_test(size=(80, 24)) as pilot:
        table = await opened(pilot, rows=7)
        ops = [row.split("│")[1].split()[0:2] for row in shown_rows(app, table)[:7]]
        assert [op[1] for op in ops if op[0] == "└"].count("add") == 2
        tree = app.screen.query_one(SearchTree)
        for key in [key.value for key in table.rows if table.card_id(key.value) == ids["add"]]:
            table.select_key(key)
            await until(pilot, lambda: tree.card.id == ids["add"], what="add's tree")
            assert table.selected_card == ids["add"]
            table.select_card(ids["relu"])
            await until(pilot, lambda: tree.card.id == ids["relu"], what="relu's tree")


async def test_the_eager_column_names_its_source_before_and_after_the_evaluator(fixture_db):
    db, ids = fixture_db
    app = make_app(db, session=1)
    async with app.run_test(size=(100, 24)) as pilot:  # one pane: every whole cell fits
        await until(pilot, lambda: isinstance(app.screen, SessionScreen)
                    and app.screen.state is not None, what="the session")
        table = app.screen.query_one(OpTable)
        assert table.heading("eager") == "eager prof"  # no op timed by the evaluator yet
        async with await Store.open(db) as store:
            await store.update_card(ids["card"], eager_us=120.0, baseline=baseline(120.0))
        await until(pilot, lambda: table.heading("eager") == "eager", what="a mixed table")

        def cells() -> dict[str, str]:
            return {key.value: table.get_row(key)[4].plain for key in table.rows}

        assert cells()[str(ids["card"])] == "120.0 us eval"
        assert cells()[str(ids["add_card"])] == "100.0 us prof"
        # Narrower, the cells keep their source and leave their unit to the heading.
        await pilot.resize_terminal(70, 24)
        await until(pilot, lambda: table.heading("eager") == "eager us", what="the unit above")
        assert cells()[str(ids["card"])] == "120.0 eval"
        assert cells()[str(ids["add_card"])] == "100.0 prof"
        async with await Store.open(db) as store:
            for card in await store.list_cards(1):
                await store.update_card(card.id, baseline=baseline(card.card.eager_us or 1.0))
        await until(pilot, lambda: table.heading("eager") == "eager eval", what="all timed")
        await pilot.pause(0.1)
        assert table.get_row(str(ids["card"]))[4].plain == "120.0 us"
        # An op without an eager time has no source: the others' heading stands.
        async with await Store.open(db) as store:
            await store.update_card(ids["add_card"], eager_us=None, baseline=None)
        await until(pilot, lambda: cells()[str(ids["add_card"])] == "-", what="no time")
        assert table.heading("eager") == "eager eval"
