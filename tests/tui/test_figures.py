"""A kernel slower than eager is never the best: no ★best on its tree line, and b says that no
kernel beats eager yet."""

from __future__ import annotations

from kforge.store import Store
from kforge_tui.widgets.search_tree import SearchTree
from tests.tui.conftest import make_app, until
from tests.tui.test_colours import line_of
from tests.tui.test_defects import notices
from tests.tui.test_render_budget import session_open


def text_of(tree: SearchTree, node_id: int) -> str:
    return "".join(segment.text for segment in line_of(tree, node_id))


async def test_a_best_kernel_slower_than_eager_is_no_best(fixture_db):
    db, ids = fixture_db
    async with await Store.open(db) as store:  # the search's best so far: 0.41x
        await store.update_card(ids["card"], best_node=ids["c"], best_speedup=0.41)
    app = make_app(db, session=1)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = await session_open(pilot)
        tree = screen.query_one(SearchTree)
        tree.open_all()
        await pilot.pause(0.1)
        assert "★best" not in text_of(tree, ids["c"])
        await pilot.press("b")
        await until(pilot, lambda: notices(app, "no kernel that beats eager yet"),
                    what="the word that none does")

        async with await Store.open(db) as store:  # a faster one found
            await store.update_card(ids["card"], best_node=ids["a1"], best_speedup=1.6)
        await until(pilot, lambda: tree.card is not None and tree.card.best_speedup == 1.6,
                    what="the new best")
        await pilot.pause(0.3)
        assert "★best" in text_of(tree, ids["a1"])
        tree.select_id(ids["b"])
        await pilot.press("b")
        await until(pilot, lambda: tree.selected_id == ids["a1"], what="b to jump to it")
