"""What counts as an op's best kernel: one faster than eager or than torch.compile (the compiled
modes may use it), confirmed. One slower than both is never the best: no ★best on its tree line,
no figure under ``×eager`` in the op table or the sessions list, and b says so. A would-be best
under confirmation reads ``confirming`` in the tree and the op table, and its figure counts only
once it is confirmed."""

from __future__ import annotations

from kforge.core.candidate import EvalOutcome, EvalStatus
from kforge.core.fmt import fmt_best_over_eager
from kforge.store import Store
from kforge_tui.widgets.search_tree import SearchTree
from kforge_tui.widgets.tables import OpTable
from tests.tui.conftest import make_app, until
from tests.tui.fixtures import baseline, timing
from tests.tui.test_colours import line_of
from tests.tui.test_defects import notices
from tests.tui.test_render_budget import session_open

BEST, STATUS = OpTable.COLUMNS.index("best"), OpTable.COLUMNS.index("status")


def text_of(tree: SearchTree, node_id: int) -> str:
    return "".join(segment.text for segment in line_of(tree, node_id))


def cell(table: OpTable, card: int, column: int) -> str:
    return table.get_row(str(card))[column].plain


async def test_a_best_kernel_slower_than_eager_and_compile_is_no_best(fixture_db):
    db, ids = fixture_db
    async with await Store.open(db) as store:  # an older database's best: 0.41x
        await store.update_card(ids["card"], best_node=ids["c"], best_speedup=0.41)
    app = make_app(db, session=1)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await session_open(pilot)
        tree = screen.query_one(SearchTree)
        table = screen.query_one(OpTable)
        tree.open_all()
        await pilot.pause(0.1)
        assert "★best" not in text_of(tree, ids["c"])
        assert cell(table, ids["card"], BEST) == "-"
        await pilot.press("b")
        await until(pilot, lambda: notices(app, "no kernel that beats eager yet (the fastest "
                                                f"so far, node #{ids['c']}: 0.41x eager)"),
                    what="the word that none does")

        async with await Store.open(db) as store:  # a faster one found
            await store.update_card(ids["card"], best_node=ids["a1"], best_speedup=1.6)
        await until(pilot, lambda: "★best" in text_of(tree, ids["a1"]), what="the new best")
        assert cell(table, ids["card"], BEST) == "1.60x"
        tree.select_id(ids["b"])
        await pilot.press("b")
        await until(pilot, lambda: tree.selected_id == ids["a1"], what="b to jump to it")


async def test_a_kernel_slower_than_eager_but_faster_than_compile_is_best_over_compile(
        fixture_db):
    db, ids = fixture_db
    async with await Store.open(db) as store:
        # The evaluator timed eager at 100 us and torch.compile at 200 us: 0.90x eager is
        # 1.80x torch.compile.
        await store.update_card(ids["card"], eager_us=100.0, compiled_us=200.0,
                                baseline=baseline(100.0, 200.0), best_node=ids["b1"],
                                best_speedup=0.9)
    app = make_app(db, session=1)
    async with app.run_test(size=(100, 24)) as pilot:  # one pane: whole tree lines
        screen = await session_open(pilot)
        assert cell(screen.query_one(OpTable), ids["card"], BEST) == "0.90x"
        await pilot.press("2")
        tree = screen.query_one(SearchTree)
        tree.open_all()
        await pilot.pause(0.3)
        assert "0.90x n=1 ★best: 1.80x over compile" in text_of(tree, ids["b1"])
        tree.select_id(ids["a"])
        await pilot.press("b")
        await until(pilot, lambda: tree.selected_id == ids["b1"], what="b to jump to it")

        # 0.997x eager never reads 1.00x: a kernel slower than eager stays below 1x
        async with await Store.open(db) as store:
            await store.update_card(ids["card"], best_speedup=0.997)
        table = screen.query_one(OpTable)
        await until(pilot, lambda: cell(table, ids["card"], BEST) == "0.997x", what="0.997x")

        async with await Store.open(db) as store:  # torch.compile as fast: no best
            await store.update_card(ids["card"], compiled_us=90.0)
        await until(pilot, lambda: "★best" not in text_of(tree, ids["b1"]),
                    what="the best to go")
        assert tree.card is not None and tree.card.card.compiled_us == 90.0
        await pilot.press("b")
        await until(pilot, lambda: notices(app, "no kernel that beats eager or torch.compile"),
                    what="the word that none does")


def test_the_sessions_list_shows_no_best_slower_than_eager():
    assert fmt_best_over_eager(1.6) == "1.60x"
    assert fmt_best_over_eager(0.41) == fmt_best_over_eager(1.0) == fmt_best_over_eager(None) \
        == "-"


async def confirm(store: Store, node_id: int, speed: float, *, confirming: bool) -> None:
    """What the engine records of a would-be best: confirming, then confirmed."""
    outcome = EvalOutcome(EvalStatus.OK, timing=timing(100 / speed), eager=timing(100.0),
                          speedup=speed)
    await store.finish_node(node_id, outcome, 0.1, confirming=confirming,
                            confirmed=not confirming)


async def test_a_would_be_best_reads_confirming_and_is_no_best_until_confirmed(fixture_db):
    db, ids = fixture_db
    async with await Store.open(db) as store:
        node = await store.add_node(ids["session"], ids["card"], ids["a1"], "refine")
        await confirm(store, node, 2.5, confirming=True)
    app = make_app(db, session=1)
    async with app.run_test(size=(100, 24)) as pilot:  # one pane, every whole cell
        screen = await session_open(pilot)
        tree = screen.query_one(SearchTree)
        table = screen.query_one(OpTable)
        tree.open_all()
        await pilot.pause(0.3)
        assert cell(table, ids["card"], STATUS) == "confirming"
        assert cell(table, ids["card"], BEST) == "1.60x"  # the confirmed best
        await pilot.press("2")
        await pilot.pause(0.1)
        assert "2.50x confirming" in text_of(tree, node)
        assert "★best" not in text_of(tree, node) and "★best" in text_of(tree, ids["a1"])
        assert "↳2.50x" not in text_of(tree, ids["a1"])

        async with await Store.open(db) as store:
            await confirm(store, node, 2.5, confirming=False)
        await until(pilot, lambda: "★best" in text_of(tree, node), what="the confirmed best")
        assert "★best" not in text_of(tree, ids["a1"])
        assert cell(table, ids["card"], BEST) == "2.50x"
        assert cell(table, ids["card"], STATUS) == "searching"
